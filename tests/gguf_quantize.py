"""Quantize float32 weights into GGUF block formats, so tests can write GGUF files in every type.

gguf-py quantizes Q8_0, Q4_0 and Q4_1 itself but raises NotImplementedError for the K-quants
(Q4_K, Q5_K, Q6_K), which are what real GGUF checkpoints mostly hold. The encoders here are simple
(per-sub-block min/max or absmax, no search for the best scales) but write the exact byte layout of
llama.cpp's block_q4_K / block_q5_K / block_q6_K, which gguf.quants' dequantizers decode; the
round trip through those dequantizers is the test of this module (tests/unit/test_gguf_quantize.py).

Everything is vectorised over blocks: a test model's weights are quantized in milliseconds.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, QK_K

# gguf-py encodes these itself; delegating keeps one definition of their rounding rules
_DELEGATED = (QT.Q8_0, QT.Q4_0, QT.Q4_1)


def quantize(weights: np.ndarray, qtype: QT) -> np.ndarray:
    """The uint8 array gguf's writer expects for `qtype`: leading dims kept, the last replaced by
    the byte length of its blocks (the convention of gguf.quants.quantize, so callers need not
    care which types gguf-py encodes itself)."""
    if qtype in _DELEGATED:
        return quants.quantize(np.asarray(weights, dtype=np.float32), qtype)
    encoder = _K_ENCODERS.get(qtype)
    if encoder is None:
        raise NotImplementedError(f"no encoder for {qtype.name}")
    x = np.asarray(weights, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK_K != 0:
        raise ValueError(f"{qtype.name} needs a last dimension that is a multiple of {QK_K}")
    if not np.isfinite(x).all():
        raise ValueError("weights must be finite")
    blocks = encoder(x.reshape(-1, QK_K))
    type_size = GGML_QUANT_SIZES[qtype][1]
    assert blocks.shape[-1] == type_size
    return blocks.reshape(*x.shape[:-1], x.shape[-1] // QK_K * type_size)


def _f16_up(x: np.ndarray) -> np.ndarray:
    """x rounded to float16, upward where nearest rounding would go down: a super-block scale that
    is never below the float32 one keeps every integer sub-scale within its 6 (or 8) bits, so the
    largest sub-block is not clipped by the float16 rounding of the scale above it."""
    h = x.astype(np.float16)
    return np.where(h.astype(np.float32) < x, np.nextafter(h, np.float16(np.inf)), h)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b with 0 where b == 0: an all-zero sub-block (or super-block) has scale 0, and its codes
    may be anything since the dequantizer multiplies them by 0."""
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, a / safe).astype(np.float32)


def _affine_k(blocks: np.ndarray, nbits: int):
    """Codes of the Q4_K/Q5_K model x = d*sc[j]*q - dmin*m[j] for (n, 256) float32 blocks, with
    eight sub-blocks of 32, sc and m 6-bit, q nbits-bit.

    The offset m is rounded to nearest (a value below the offset loses at most dmin/2); the scale
    is then rounded *up* so that the sub-block's top value is never clipped: rounding it to nearest
    would cut up to 15 steps of the 6-bit scale grid off the top of small sub-blocks.
    Returns d, dmin (float16, (n,)), sc, m (uint8, (n, 8)) and q (uint8, (n, 8, 32))."""
    x = blocks.reshape(-1, 8, 32)
    qmax = (1 << nbits) - 1
    # the format stores -min as an unsigned 6-bit offset, so a positive minimum becomes 0
    neg_min = -np.minimum(x.min(axis=-1), 0)
    dmin = _f16_up(neg_min.max(axis=-1) / 63)
    dmin32 = dmin.astype(np.float32)[:, None]
    m = np.clip(np.rint(_div(neg_min, dmin32)), 0, 63)
    lower = -(dmin32 * m)  # what the dequantizer subtracts, computed as it computes it
    step = np.maximum(x.max(axis=-1) - lower, 0) / qmax
    d = _f16_up(step.max(axis=-1) / 63)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.ceil(_div(step, d32)), 0, 63)
    step_q = (d32 * sc)[..., None]
    q = np.clip(np.rint(_div(x - lower[..., None], step_q)), 0, qmax)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 bytes of 6-bit scales and mins (ggml's get_scale_min_k4 reads them back): bytes 0-3
    hold sc[0..3] in the low 6 bits and the top 2 bits of sc[4..7], bytes 4-7 the same for the mins,
    bytes 8-11 the low nibbles of sc[4..7] (low) and of m[4..7] (high)."""
    lo_sc = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    lo_m = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo_sc, lo_m, hi], axis=-1).astype(np.uint8)


def _pack_nibbles_k(q: np.ndarray) -> np.ndarray:
    """(n, 8, 32) codes to the 128 quant bytes of Q4_K/Q5_K: sub-blocks 2i and 2i+1 share bytes
    32i..32i+31, the even one in the low nibble."""
    q = (q & 0x0F).reshape(-1, 4, 2, 32)
    return (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, QK_K // 2)


def _encode_q4_k(blocks: np.ndarray) -> np.ndarray:
    """block_q4_K: d f16, dmin f16, 12 scale bytes, 128 quant bytes (144 in all)."""
    d, dmin, sc, m, q = _affine_k(blocks, 4)
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), _pack_nibbles_k(q)], axis=-1
    )


def _encode_q5_k(blocks: np.ndarray) -> np.ndarray:
    """block_q5_K: as Q4_K with the fifth bits in 32 qh bytes before the nibbles (176 in all):
    bit j of qh[i] is the high bit of element i of sub-block j."""
    d, dmin, sc, m, q = _affine_k(blocks, 5)
    shifts = np.arange(8, dtype=np.uint8)[None, :, None]
    qh = np.bitwise_or.reduce(((q >> 4) & 1) << shifts, axis=1).astype(np.uint8)
    return np.concatenate(
        [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qh, _pack_nibbles_k(q)], axis=-1
    )


def _encode_q6_k(blocks: np.ndarray) -> np.ndarray:
    """block_q6_K: 128 ql bytes (low nibbles), 64 qh bytes (2 high bits each), 16 int8 sub-block
    scales, d f16 (210 in all); x = d * scale[k] * (q - 32) over 16 sub-blocks of 16.

    Symmetric absmax per sub-block (codes -31..31, scale rounded up so nothing clips); the
    scales are kept non-negative, which the int8 field allows."""
    x = blocks.reshape(-1, 16, 16)
    step = np.abs(x).max(axis=-1) / 31
    d = _f16_up(step.max(axis=-1) / 127)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.ceil(_div(step, d32)), 0, 127)
    step_q = (d32 * sc)[..., None]
    q = (np.clip(np.rint(_div(x, step_q)), -32, 31) + 32).astype(np.uint8)
    # element h*128 + k*32 + i: low nibble in ql[h*64 + (k%2)*32 + i] (high half of the byte for
    # k >= 2), its two high bits at bits 2k of qh[h*32 + i]
    q = q.reshape(-1, 2, 4, 32)
    lo = q & 0x0F
    ql = (lo[:, :, :2, :] | (lo[:, :, 2:, :] << 4)).reshape(-1, QK_K // 2)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    qh = np.bitwise_or.reduce((q >> 4) << shifts, axis=2).reshape(-1, QK_K // 4)
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh.astype(np.uint8), scales, _f16_bytes(d)], axis=-1)


def _f16_bytes(h: np.ndarray) -> np.ndarray:
    """(n,) float16 to its (n, 2) little-endian bytes, as the block structs store ggml_half."""
    return h.astype("<f2").reshape(-1, 1).view(np.uint8)


_K_ENCODERS = {QT.Q4_K: _encode_q4_k, QT.Q5_K: _encode_q5_k, QT.Q6_K: _encode_q6_k}
