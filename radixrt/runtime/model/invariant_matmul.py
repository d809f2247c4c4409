"""y = x W^T with each row's bits independent of the row count (--enable-deterministic-inference).

A GEMM library picks its kernel and blocking by the shape it is given: on a 2-core Zen 1 EPYC a
float32 row of F.linear differs from the same row computed alone at every row count from 2 up, and
oneDNN's packed bf16 GEMM changes its blocking past 32 rows. Multiplying in tiles of a fixed row
count (the last one zero-padded; tile_rows) gives every row the same kernel, whatever the step's
size; a row's neighbours in its tile never change its value. The tiles go to one batched matmul
(torch.bmm, the weight broadcast, not copied), which runs a 2,048-row step about as fast as
F.linear; a packed oneDNN weight, which bmm cannot read, is multiplied tile by tile.

That this holds is checked, not assumed: `check` multiplies every weight shape of the model at
several row counts and positions at start-up and refuses to start where a row changes (no silent
loss of the guarantee on a CPU or library whose kernels behave otherwise).
"""

from __future__ import annotations

import torch

# A tile costs what TILE_ROWS rows cost, however few are real: 8 rows run a one-row decode step's
# layer matmuls in ~0.45 ms (a 1536 x 576 weight on a 2-core Zen 1 EPYC; 16 rows: 0.64, F.linear:
# 0.10) and a 2,048-row prefill as fast as 16 (~51 ms, F.linear 50). A vocabulary-sized weight (the
# lm_head, one row per request) is read in tiles of VOCAB_TILE_ROWS: 24 ms for one row, 47 at 16.
TILE_ROWS = 8
VOCAB_TILE_ROWS = 4
VOCAB_SIZED = 16384  # output features from which a weight is the lm_head's kind
# row counts and offsets the start-up check compares against a row computed alone
CHECK_ROWS = (1, 2, 5, TILE_ROWS, TILE_ROWS + 1, 3 * TILE_ROWS + 5)


def tile_rows(w: torch.Tensor) -> int:
    """The fixed tile of a weight (a rule of its shape, so every step uses the same one)."""
    return VOCAB_TILE_ROWS if w.shape[0] >= VOCAB_SIZED else TILE_ROWS


def matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] times w [N, K] (plain, or oneDNN-packed) -> [T, N] (+ bias)."""
    rows, tile = x.shape[0], tile_rows(w)
    tiles = -(-rows // tile)
    if tiles * tile == rows:
        padded = x.contiguous()
    else:
        padded = x.new_zeros((tiles * tile, x.shape[1]))
        padded[:rows] = x
    if w.is_mkldnn:
        y = torch.cat(
            [
                torch.ops.mkldnn._linear_pointwise(t, w, None, "none", [], "")
                for t in padded.split(tile)
            ]
        )
    else:
        y = torch.bmm(padded.view(tiles, tile, -1), w.t().expand(tiles, -1, -1))
        y = y.view(tiles * tile, -1)
    y = y[:rows]
    return y if bias is None else y + bias


def check(weights: list[torch.Tensor], dtype: torch.dtype) -> None:
    """Raise RuntimeError unless every row of `matmul` equals that row multiplied alone, for each
    distinct weight shape, at CHECK_ROWS row counts and at an offset."""
    seen = set()
    gen = torch.Generator().manual_seed(0)
    for w in weights:
        key = (tuple(w.shape), w.is_mkldnn)
        if key in seen:
            continue
        seen.add(key)
        k = w.shape[1]
        x = torch.randn(max(CHECK_ROWS) + 3, k, generator=gen).to(dtype=dtype, device=w.device)
        alone = torch.cat([matmul(x[i : i + 1], w, None) for i in range(x.shape[0])])
        for rows in CHECK_ROWS:
            for offset in (0, 3):
                got = matmul(x[offset : offset + rows], w, None)
                if not torch.equal(got, alone[offset : offset + rows]):
                    raise RuntimeError(
                        f"deterministic inference: a {dtype} matmul row of a {tuple(w.shape)} "
                        f"weight changes with the row count ({rows} rows at offset {offset}) on "
                        "this CPU and torch build; the guarantee cannot be given here"
                    )
