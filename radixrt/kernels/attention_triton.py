"""Triton attention backend over the paged KV pool (GPU default; CPU only under TRITON_INTERPRET=1).

Same interface as the torch backend (attention_torch.py):
  init_forward_metadata(fb)  once per forward: flat slot lists, indptrs, decode split plan, scratch
  forward(q, k, v, k_cache, v_cache, fb, scale[, k_scale, v_scale])  per layer: store new K/V
      (quantised when the pool is, kv_quant.py), then decode + extend kernels
The first fb.num_decode requests go to the split-KV decode kernel (triton_decode.py), the rest
to the extend kernel (triton_extend.py). Everything the kernels index is int64, so slot * stride
never overflows on large pools. The batch's layout (slot lists, split plan, launch tiles) is
attention_triton_plan.py's; this module checks the inputs and launches the kernels.
"""

from __future__ import annotations

import math
import os

import torch
import triton

from radixrt.kernels.attention_batch import AttentionBatch
from radixrt.kernels.attention_triton_plan import (
    TritonAttnMeta,
    extend_launch_config,
    flat_slots,
    plan_decode_splits,
    plan_forward,
)
from radixrt.kernels.kv_quant import LayerKV
from radixrt.kernels.triton_decode import _decode_stage1, _decode_stage2
from radixrt.kernels.triton_extend import _extend_kernel

# the layout's pieces are importable from here too, beside the backend
__all__ = [
    "TritonAttentionBackend",
    "TritonAttnMeta",
    "extend_launch_config",
    "flat_slots",
    "plan_decode_splits",
    "plan_forward",
]

LOG2E = 1.4426950408889634


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class TritonAttentionBackend:
    """Paged attention with Triton kernels; GQA by head grouping; any page size (slots are
    arbitrary)."""

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
        """Lay the batch out once per forward (attention_triton_plan.py); every layer reuses it."""
        fb.attn_meta = plan_forward(
            fb,
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            target_programs=self._target_programs(fb.req_to_slot.device),
            max_kv_splits=self.max_kv_splits,
            min_split_len=self.min_split_len,
            block_n=self.decode_block_n,
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
        softcap: float | None = None,
    ) -> torch.Tensor:
        """k_scale/v_scale: the pool is quantised (kv_quant.py); the kernels scale its rows as they
        read them. window: a sliding-window layer (keys within `window` positions of the query,
        itself included). softcap: scores become tanh(s / cap) * cap (Gemma 2)."""
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
        # a quantised pool's scales; otherwise any tensor stands in for the pointers the kernel
        # never reads
        scales = (k_scale, v_scale) if k_scale is not None else (k_cache, v_cache)
        out = torch.empty(
            (num_tokens, self.num_q_heads, self.head_dim), dtype=q.dtype, device=q.device
        )
        # the scores' scale and soft cap, both in the log2 domain the kernels work in (0: no cap)
        scores = (scale * LOG2E, (softcap or 0.0) * LOG2E)
        # The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584):
        # upcast there.
        dot_fp32 = _interpreting() and q.dtype == torch.bfloat16
        precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32: exactness, not speed
        window = window or 0
        if meta.num_decode:
            self._decode(
                q, k_cache, v_cache, scales, out, meta, scores, window, dot_fp32, precision
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
                scores,
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
        scores,
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
            *scores,
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
        scores,
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
            *scores,
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
