"""How the Triton attention backend lays a batch out, once per forward (all layers reuse it).

The decode requests' and the extends' prefix KV slots as flat lists with indptrs (flat_slots), how
many splits each decode request's KV gets (plan_decode_splits), the per-forward TritonAttnMeta
holding both and the decode scratch (plan_forward), and the extend kernel's tile sizes
(extend_launch_config).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention_batch import AttentionBatch


@dataclass
class TritonAttnMeta:
    num_decode: int
    num_extend: int
    # decode: request b's KV slots are decode_kv_indices[decode_kv_indptr[b]:decode_kv_indptr[b+1]]
    decode_kv_indptr: torch.Tensor  # [num_decode+1] int64
    decode_kv_indices: torch.Tensor  # [sum decode seq_lens] int64
    num_splits: torch.Tensor  # [num_decode] int64
    chunk_lens: torch.Tensor  # [num_decode] int64 KV positions per split
    max_splits: int
    part_out: torch.Tensor  # [num_decode, Hq, max_splits, D] fp32 scratch, shared by all layers
    part_lse: torch.Tensor  # [num_decode, Hq, max_splits] fp32
    # extend: request e's new rows are ext_qo_indptr[e]:ext_qo_indptr[e+1] of T (absolute)
    ext_qo_indptr: torch.Tensor  # [num_extend+1] int64
    prefix_indptr: torch.Tensor  # [num_extend+1] int64
    prefix_indices: torch.Tensor  # [sum extend prefix_lens] int64
    max_extend_len: int


def flat_slots(
    req_to_slot: torch.Tensor, rows: torch.Tensor, lens_t: torch.Tensor, lens: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr [B+1], slots of positions 0..lens[b]-1 of each row, concatenated).

    lens_t is lens on the device (from the AttentionBatch); the python copy sizes the outputs, so
    there is no host sync and no extra upload.
    """
    device = req_to_slot.device
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int64, device=device)
    total = sum(lens)
    if total == 0:
        return indptr, torch.zeros(0, dtype=torch.int64, device=device)
    torch.cumsum(lens_t, 0, out=indptr[1:])
    row_rep = torch.repeat_interleave(rows, lens_t, output_size=total)
    col = torch.arange(total, device=device) - torch.repeat_interleave(
        indptr[:-1], lens_t, output_size=total
    )
    return indptr, req_to_slot[row_rep, col]


def plan_decode_splits(
    seq_lens: list[int],
    num_kv_heads: int,
    target_programs: int,
    max_splits: int,
    min_split_len: int,
    align: int,
) -> tuple[list[int], list[int]]:
    """Per request (num_splits, chunk_len) so the stage-1 grid has about target_programs busy
    programs.

    Work is balanced by length: every chunk has at least `chunk` KV positions (the batch's share per
    program), so a long request gets more splits than a short one and a batch that already fills
    the device is not split at all. Chunks are multiples of `align` (the kernel's tile)
    and never empty: chunk_len * (num_splits - 1) < seq_len.
    """
    total = sum(seq_lens) * num_kv_heads
    chunk = max(min_split_len, -(-total // max(target_programs, 1)))
    num_splits, chunk_lens = [], []
    for seq_len in seq_lens:
        n = max(1, min(max_splits, seq_len // chunk))
        c = -(-seq_len // n)
        c = -(-c // align) * align
        n = -(-seq_len // c)
        assert n >= 1 and c * (n - 1) < seq_len
        num_splits.append(n)
        chunk_lens.append(c)
    return num_splits, chunk_lens


def extend_launch_config(
    head_dim: int, dtype: torch.dtype, capability: tuple[int, int] | None
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the extend kernel; capability None =
    interpreter.

    Untuned guesses in SGLang's spirit; fp32 (exact ieee dots) gets smaller tiles so its shared
    memory fits on every sm80+ part.
    """
    if capability is None:
        return 16, 16, 1, 1
    num_warps = 4 if head_dim <= 64 else 8
    if dtype == torch.float32:
        return 64, 32, num_warps, 1
    if capability[0] >= 8:
        return 128, 64, num_warps, 1
    return 64, 64, num_warps, 1


def plan_forward(
    fb: AttentionBatch,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    target_programs: int,
    max_kv_splits: int,
    min_split_len: int,
    block_n: int,
) -> TritonAttnMeta:
    """The layout of `fb` every layer's kernels read: the first fb.num_decode requests' KV slots
    and their split plan (chunks aligned to block_n, the decode tile) with the split-KV scratch,
    then the extends' new rows and prefix slots."""
    device = fb.req_to_slot.device
    nd = fb.num_decode
    ne = fb.batch_size - nd
    decode_lens = fb.seq_lens_list[:nd]
    decode_indptr, decode_indices = flat_slots(
        fb.req_to_slot, fb.req_rows[:nd], fb.seq_lens[:nd], decode_lens
    )
    splits, chunks = plan_decode_splits(
        decode_lens,
        num_kv_heads,
        target_programs,
        max_kv_splits,
        min_split_len,
        block_n,
    )
    max_splits = max(splits, default=1)
    prefix_lens = [s - e for s, e in zip(fb.seq_lens_list[nd:], fb.extend_lens_list[nd:])]
    prefix_indptr, prefix_indices = flat_slots(
        fb.req_to_slot, fb.req_rows[nd:], fb.prefix_lens[nd:], prefix_lens
    )
    plan = torch.tensor([splits, chunks], dtype=torch.int64).to(device, non_blocking=True)
    return TritonAttnMeta(
        num_decode=nd,
        num_extend=ne,
        decode_kv_indptr=decode_indptr,
        decode_kv_indices=decode_indices,
        num_splits=plan[0],
        chunk_lens=plan[1],
        max_splits=max_splits,
        part_out=torch.empty(
            (nd, num_q_heads, max_splits, head_dim),
            dtype=torch.float32,
            device=device,
        ),
        part_lse=torch.empty((nd, num_q_heads, max_splits), dtype=torch.float32, device=device),
        ext_qo_indptr=fb.qo_indptr[nd:],
        prefix_indptr=prefix_indptr,
        prefix_indices=prefix_indices,
        max_extend_len=max(fb.extend_lens_list[nd:], default=0),
    )
