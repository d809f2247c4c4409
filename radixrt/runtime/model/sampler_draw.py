"""Drawing one token per row from truncated probabilities, exactly, with per-row seeds.

The exponential race argmax(p / Exp(1)) on a GPU (one kernel per op) and a two-level inverse CDF on
a CPU (a CPU makes exponential noise slowly); same distribution. A seeded row draws from a generator
seeded by (seed, step), so its token depends neither on the batch nor on the global RNG.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def draw_race(probs: torch.Tensor, seeded: list[tuple[int, int, int]]) -> torch.Tensor:
    """Exponential race argmax(p / Exp(1)): exact, no cumsum, one kernel per op on a GPU.

    Unseeded rows share the default generator in one batched draw; a seeded row draws its own
    vocabulary of noise from a generator seeded by (seed, step)."""
    num_rows, vocab_size = probs.shape
    noise = torch.empty_like(probs).exponential_()
    for i, seed, step in seeded:
        gen = _generator(seed, step, probs.device)
        noise[i] = torch.empty(vocab_size, device=probs.device).exponential_(generator=gen)
    # exponential_ may return exactly 0; p / 0 would be inf (or NaN for p = 0) and win the race
    return (probs / noise.clamp_min_(torch.finfo(torch.float32).tiny)).argmax(dim=-1)


_CDF_CHUNK = 256


def draw_inverse_cdf(probs: torch.Tensor, seeded: list[tuple[int, int, int]]) -> torch.Tensor:
    """Inverse CDF with one uniform per row, in two levels: pick a chunk of 256 tokens from the
    float64 cumsum of chunk sums, then the token from the float64 cumsum inside that chunk. A CPU
    makes a vocabulary of exponential noise ~20x slower than this and a flat float64 cumsum ~10x;
    a flat float32 cumsum would blur tail tokens' intervals by ulp(1)."""
    num_rows, vocab_size = probs.shape
    device = probs.device
    pad = -vocab_size % _CDF_CHUNK
    chunks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).view(
        num_rows, -1, _CDF_CHUNK
    )
    chunk_cum = chunks.sum(dim=-1).double().cumsum(dim=-1)  # [S, C]
    u = torch.rand(num_rows, 1, dtype=torch.float64, device=device)
    for i, seed, step in seeded:
        u[i] = torch.rand(
            1, dtype=torch.float64, device=device, generator=_generator(seed, step, device)
        )
    total = chunk_cum[:, -1:]
    target = u * total
    # first chunk whose cumsum passes target; it grew there, so it holds a token with p > 0
    # [S, 1]
    chunk_idx = torch.searchsorted(chunk_cum, target, right=True).clamp_max_(chunk_cum.shape[1] - 1)
    before = chunk_cum.gather(1, (chunk_idx - 1).clamp_min(0)) * (chunk_idx > 0)
    # [S, CHUNK]
    chunk = chunks.gather(1, chunk_idx.unsqueeze(2).expand(-1, 1, _CDF_CHUNK)).squeeze(1)
    inner = chunk.cumsum(dim=-1, dtype=torch.float64)
    inner_total = inner[:, -1:]
    # clamp into [0, inner_total): rounding between the two levels can never reach a p = 0 token
    inner_target = torch.minimum(
        (target - before).clamp_min_(0.0), torch.nextafter(inner_total, before * 0)
    )
    token_idx = torch.searchsorted(inner, inner_target, right=True).clamp_max_(_CDF_CHUNK - 1)
    return (chunk_idx * _CDF_CHUNK + token_idx).squeeze(1).clamp_max_(vocab_size - 1)


def use_race(device: torch.device) -> bool:
    return device.type != "cpu"


def _generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(_mix_seed(seed, step))
    return gen


def _mix_seed(seed: int, step: int) -> int:
    """splitmix64 of (seed, step): nearby seeds and steps give unrelated generator states."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)
