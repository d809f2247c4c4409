"""Triton attention backend over the paged KV pool (GPU default; CPU only under TRITON_INTERPRET=1).

Same interface as the torch backend (attention_torch.py):
  init_forward_metadata(fb)  once per forward: flat slot lists, indptrs, decode split plan, scratch
  forward(q, k, v, k_cache, v_cache, fb, scale[, k_scale, v_scale])  per layer: store new K/V (quantised
      when the pool is, kv_quant.py), then decode + extend kernels
The first fb.num_decode requests go to the split-KV decode kernel (triton_decode.py), the rest
to the extend kernel (triton_extend.py). Everything the kernels index is int64, so slot * stride
never overflows on large pools.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from radixrt.kernels.attention_batch import AttentionBatch
from radixrt.kernels.kv_quant import LayerKV
from radixrt.kernels.triton_decode import _decode_stage1, _decode_stage2
from radixrt.kernels.triton_extend import _extend_kernel

LOG2E = 1.4426950408889634


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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
    """Per request (num_splits, chunk_len) so the stage-1 grid has about target_programs busy programs.

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
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the extend kernel; capability None = interpreter.

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


class TritonAttentionBackend:
    """Paged attention with Triton kernels; GQA by head grouping; any page size (slots are arbitrary)."""

    def __init__(
        self,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        max_kv_splits: int = 16,
        min_split_len: int = 128,
        target_programs: int | None = None,
    ):
        if num_kv_heads < 1 or num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if head_dim < 16:
            raise ValueError(f"head_dim must be >= 16 for tl.dot, got {head_dim}")
        if max_kv_splits < 1 or min_split_len < 1:
            raise ValueError("max_kv_splits and min_split_len must be >= 1")
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_q_heads // num_kv_heads
        self.max_kv_splits = max_kv_splits
        self.min_split_len = min_split_len
        self.target_programs = target_programs
        self.block_d = triton.next_power_of_2(head_dim)
        self.block_h = max(16, triton.next_power_of_2(self.group))  # tl.dot needs >= 16 rows
        # Small tiles under the interpreter so short test sequences still cross tile borders.
        self.decode_block_n = 16 if _interpreting() else 64

    def _capability(self, device: torch.device) -> tuple[int, int] | None:
        return None if _interpreting() else torch.cuda.get_device_capability(device)

    def _target_programs(self, device: torch.device) -> int:
        if self.target_programs is not None:
            return self.target_programs
        if device.type == "cuda":
            # a few waves of programs per SM hides the latency of the gathered KV loads
            return 4 * torch.cuda.get_device_properties(device).multi_processor_count
        return 16

    def init_forward_metadata(self, fb: AttentionBatch) -> None:
        device = fb.req_to_slot.device
        nd = fb.num_decode
        ne = fb.batch_size - nd
        decode_lens = fb.seq_lens_list[:nd]
        decode_indptr, decode_indices = flat_slots(
            fb.req_to_slot, fb.req_rows[:nd], fb.seq_lens[:nd], decode_lens
        )
        splits, chunks = plan_decode_splits(
            decode_lens,
            self.num_kv_heads,
            self._target_programs(device),
            self.max_kv_splits,
            self.min_split_len,
            self.decode_block_n,
        )
        max_splits = max(splits, default=1)
        prefix_lens = [s - e for s, e in zip(fb.seq_lens_list[nd:], fb.extend_lens_list[nd:])]
        prefix_indptr, prefix_indices = flat_slots(
            fb.req_to_slot, fb.req_rows[nd:], fb.prefix_lens[nd:], prefix_lens
        )
        plan = torch.tensor([splits, chunks], dtype=torch.int64).to(
            device, non_blocking=True
        )  # one upload
        fb.attn_meta = TritonAttnMeta(
            num_decode=nd,
            num_extend=ne,
            decode_kv_indptr=decode_indptr,
            decode_kv_indices=decode_indices,
            num_splits=plan[0],
            chunk_lens=plan[1],
            max_splits=max_splits,
            part_out=torch.empty(
                (nd, self.num_q_heads, max_splits, self.head_dim),
                dtype=torch.float32,
                device=device,
            ),
            part_lse=torch.empty(
                (nd, self.num_q_heads, max_splits), dtype=torch.float32, device=device
            ),
            ext_qo_indptr=fb.qo_indptr[nd:],
            prefix_indptr=prefix_indptr,
            prefix_indices=prefix_indices,
            max_extend_len=max(fb.extend_lens_list[nd:], default=0),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        fb: AttentionBatch,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """k_scale/v_scale: the pool is quantised (kv_quant.py); the kernels scale its rows as they read them.
        window: a sliding-window layer (keys within `window` positions of the query, itself included)."""
        meta: TritonAttnMeta = fb.attn_meta
        assert meta is not None, "init_forward_metadata(fb) must run before forward"
        if q.device.type != "cuda" and not _interpreting():
            raise ValueError(
                "TritonAttentionBackend needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)"
            )
        num_tokens = q.shape[0]
        assert q.shape == (num_tokens, self.num_q_heads, self.head_dim), q.shape
        assert k.shape == v.shape == (num_tokens, self.num_kv_heads, self.head_dim), k.shape
        assert (k_scale is not None) or (k_cache.dtype == k.dtype and v_cache.dtype == v.dtype), (
            k_cache.dtype
        )
        assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1, (
            "head_dim must be contiguous"
        )
        assert k_cache.stride(2) == 1 and v_cache.stride(2) == 1
        LayerKV(k_cache, k_scale).write(fb.out_slots, k)
        LayerKV(v_cache, v_scale).write(fb.out_slots, v)
        # a quantised pool's scales; otherwise any tensor stands in for the pointers the kernel never reads
        scales = (k_scale, v_scale) if k_scale is not None else (k_cache, v_cache)
        out = torch.empty(
            (num_tokens, self.num_q_heads, self.head_dim), dtype=q.dtype, device=q.device
        )
        sm_scale_log2 = scale * LOG2E
        # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584): upcast there.
        dot_fp32 = _interpreting() and q.dtype == torch.bfloat16
        precision = (
            "ieee" if q.dtype == torch.float32 else "tf32"
        )  # fp32 runs are for exactness, not speed
        window = window or 0
        if meta.num_decode:
            self._decode(
                q, k_cache, v_cache, scales, out, meta, sm_scale_log2, window, dot_fp32, precision
            )
        if meta.num_extend:
            self._extend(
                q,
                k,
                v,
                k_cache,
                v_cache,
                scales,
                out,
                meta,
                sm_scale_log2,
                window,
                dot_fp32,
                precision,
            )
        return out

    def _decode(
        self,
        q,
        k_cache,
        v_cache,
        scales,
        out,
        meta: TritonAttnMeta,
        sm_scale_log2,
        window,
        dot_fp32,
        precision,
    ):
        nd = meta.num_decode
        po, pl = meta.part_out, meta.part_lse
        _decode_stage1[(nd, self.num_kv_heads, meta.max_splits)](
            q,
            k_cache,
            v_cache,
            *scales,
            meta.decode_kv_indptr,
            meta.decode_kv_indices,
            meta.num_splits,
            meta.chunk_lens,
            po,
            pl,
            sm_scale_log2,
            window,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            v_cache.stride(0),
            v_cache.stride(1),
            scales[0].stride(0),
            po.stride(0),
            po.stride(1),
            po.stride(2),
            pl.stride(0),
            pl.stride(1),
            GROUP=self.group,
            HEAD_DIM=self.head_dim,
            BLOCK_D=self.block_d,
            BLOCK_H=self.block_h,
            BLOCK_N=self.decode_block_n,
            DOT_FP32=dot_fp32,
            PRECISION=precision,
            QUANT=scales[0] is not k_cache,
            num_warps=4,
            num_stages=2,
        )
        _decode_stage2[(nd, self.num_q_heads)](
            po,
            pl,
            meta.num_splits,
            out,
            po.stride(0),
            po.stride(1),
            po.stride(2),
            pl.stride(0),
            pl.stride(1),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=self.head_dim,
            BLOCK_D=self.block_d,
            BLOCK_S=max(2, triton.next_power_of_2(meta.max_splits)),
            num_warps=4,
        )

    def _extend(
        self,
        q,
        k,
        v,
        k_cache,
        v_cache,
        scales,
        out,
        meta: TritonAttnMeta,
        sm_scale_log2,
        window,
        dot_fp32,
        precision,
    ):
        block_m, block_n, num_warps, num_stages = extend_launch_config(
            self.head_dim, q.dtype, self._capability(q.device)
        )
        num_tiles = math.ceil(meta.max_extend_len / block_m)
        _extend_kernel[(meta.num_extend, self.num_q_heads, num_tiles)](
            q,
            k,
            v,
            k_cache,
            v_cache,
            *scales,
            out,
            meta.ext_qo_indptr,
            meta.prefix_indptr,
            meta.prefix_indices,
            sm_scale_log2,
            window,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            v_cache.stride(0),
            v_cache.stride(1),
            scales[0].stride(0),
            out.stride(0),
            out.stride(1),
            GROUP=self.group,
            HEAD_DIM=self.head_dim,
            BLOCK_D=self.block_d,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            DOT_FP32=dot_fp32,
            PRECISION=precision,
            QUANT=scales[0] is not k_cache,
            num_warps=num_warps,
            num_stages=num_stages,
        )
