"""Torch-native paged attention (the CPU default); attention_reference.py is the truth it is tested against.

Layout (see attention_batch.py): q/k/v rows are the flat token axis T, decode requests first.
The KV of request b lives in pool slots `req_to_slot[req_rows[b], :seq_lens[b]]`; its new
tokens sit at positions prefix_lens[b] .. seq_lens[b]-1 and see every key up to their own position.

The backend pads each group (decode; extends, in runs of short and long ones) into dense [B, L]
index matrices once per forward (`init_forward_metadata`), so each layer is a handful of gathers
and one SDPA call per group (two and a merge for a cascade), never a Python loop over requests.

Cascade: when every request of a group reads the same pool slots for its first S positions (a
radix-cache prefix they all borrow) and no request has new tokens there, the group's shared K/V
is gathered once and all its query rows attend to it in one unmasked call; each request then
attends to its own positions S.. only, and the two partial softmaxes are merged by their
log-sum-exps. That reads the shared prefix once per layer instead of once per request.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixrt.kernels.attention_batch import AttentionBatch


# The cascade's second attention call and merge cost a fixed ~0.1-0.2 ms a layer on one core; it
# pays off once the K/V it spares re-reading, (B - 1) * S * Hkv * D, is above about 512 positions at
# SmolLM2's 3 x 64 (benchmarks/bench_attention_cpu.py). Short shared runs are not worth the merge.
CASCADE_MIN_SHARED_LEN = 32
CASCADE_MIN_SAVED_KV = 512 * 3 * 64
# Extends of at most this many new tokens (jump-forward drafts, resumed or cached-prompt tails) are
# padded in a group of their own, apart from long prefill chunks.
SHORT_EXTEND_LEN = 32


def _attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], additive mask broadcastable to [B, 1, Lq, Lk] or None
    -> (out [B, Hq, Lq, D] in q's dtype, lse [B, Hq, Lq] float32). q head h reads kv head h // (Hq // Hkv).
    Every row must see at least one key."""
    if q.device.type == "cpu":  # the CPU flash kernel returns the log-sum-exp and handles GQA natively
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                          scale=scale)
    return _attend_lse_matmul(q, k, v, mask, scale)


def _attend_lse_matmul(q, k, v, mask, scale):
    """_attend_lse with explicit matmuls in float32 (devices without the CPU flash kernel)."""
    b, num_q_heads, q_len, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    qg = q.float().reshape(b, num_kv_heads, group * q_len, head_dim)  # the group's heads as extra rows
    scores = (qg @ k.float().transpose(-1, -2) * scale).view(b, num_kv_heads, group, q_len, -1)
    if mask is not None:
        scores = scores + mask.float()[:, :, None]  # [B, 1, 1, Lq, Lk] over (Hkv, G)
    lse = torch.logsumexp(scores, dim=-1)  # [B, Hkv, G, Lq]
    probs = torch.exp(scores - lse[..., None]).view(b, num_kv_heads, group * q_len, -1)
    out = (probs @ v.float()).view(b, num_q_heads, q_len, head_dim)
    return out.to(q.dtype), lse.view(b, num_q_heads, q_len)


def _merge(out_own: torch.Tensor, lse_own: torch.Tensor, out_shared: torch.Tensor, lse_shared: torch.Tensor
           ) -> torch.Tensor:
    """Softmax attention over two disjoint key sets -> attention over their union, in float32.
    out [..., D], lse [...]; the result has out_own's dtype and (contiguous) layout."""
    weight_shared = torch.sigmoid(lse_shared - lse_own)  # e^lse_shared / (e^lse_own + e^lse_shared), no overflow
    return torch.lerp(out_own.float(), out_shared.float(), weight_shared[..., None]).to(out_own.dtype)


def _additive(visible: torch.Tensor, device) -> torch.Tensor:
    """0 / -inf float mask: SDPA would otherwise convert a bool mask again in every layer.
    Made float32 here; the first layer casts it to the model dtype once."""
    return torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))


@dataclass
class _SharedPrefix:
    """Positions 0..kv_len-1 read the same pool slots in every request of a group, before every new token."""
    kv_len: int                    # S
    kv_idx: torch.Tensor           # [S] pool slots


@dataclass
class _DecodeMeta:
    num_reqs: int
    kv_len: int                    # Ld: longest KV in the group (own part: minus S)
    kv_idx: torch.Tensor           # [Bd * Ld] pool slots (padding points at a valid slot, masked)
    mask: torch.Tensor | None      # [Bd, 1, 1, Ld] additive, None when every request has length Ld
    shared: _SharedPrefix | None = None  # set: kv_len/kv_idx/mask cover only positions S..


@dataclass
class _ExtendMeta:
    num_reqs: int
    q_start: int                   # first row of the group in T
    num_tokens: int                # Te: rows of T the group owns
    q_len: int                     # Lq: longest extend in the group
    kv_len: int                    # Lk: longest KV in the group (own part: minus S)
    kv_idx: torch.Tensor | None    # [Be * Lk] pool slots; None: attend to the new k/v directly
    q_idx: torch.Tensor | None     # [Be * Lq] rows of T to pad q into; None: no padding needed
    unpad_idx: torch.Tensor | None # [Te] rows of the padded [Be * Lq] output that are real tokens
    mask: torch.Tensor | None      # [Be, 1, Lq, Lk] additive; None: plain causal (is_causal)
    shared: _SharedPrefix | None = None  # set: kv_len/kv_idx/mask cover only positions S..


@dataclass
class TorchAttentionMeta:
    decode: _DecodeMeta | None
    extends: list[_ExtendMeta]     # consecutive runs of short / long extends, each padded on its own
    k_buf: torch.Tensor | None = None  # gather workspaces reused by every layer of this forward
    v_buf: torch.Tensor | None = None


class TorchAttentionBackend:
    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 min_shared_len: int | None = CASCADE_MIN_SHARED_LEN, min_saved_kv: int = CASCADE_MIN_SAVED_KV):
        """The cascade is taken for a group whose shared prefix S >= min_shared_len and whose
        (num_reqs - 1) * S * num_kv_heads * head_dim >= min_saved_kv; min_shared_len None: never."""
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        if min_shared_len is not None and min_shared_len < 1:
            raise ValueError(f"min_shared_len must be >= 1 or None, got {min_shared_len}")
        if min_saved_kv < 0:
            raise ValueError(f"min_saved_kv must be >= 0, got {min_saved_kv}")
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_q_heads // num_kv_heads
        self.min_shared_len = min_shared_len
        self.min_saved_kv = min_saved_kv

    def init_forward_metadata(self, fb: AttentionBatch) -> None:
        num_decode = fb.num_decode
        decode = self._decode_meta(fb) if num_decode else None
        extends = []
        q_start = num_decode  # each decode request owns exactly one row of T
        for lo, hi in _extend_runs(fb.extend_lens_list, num_decode):
            extends.append(self._extend_meta(fb, lo, hi, q_start))
            q_start += sum(fb.extend_lens_list[lo:hi])
        fb.attn_meta = TorchAttentionMeta(decode, extends)

    def _shared_prefix(self, table: torch.Tensor, max_len: int) -> _SharedPrefix | None:
        """table [B, L]: a group's slots by position; max_len: its shortest prefix_len, so that every
        new token comes after the shared part (which then needs no mask)."""
        num_reqs = table.shape[0]
        if self.min_shared_len is None or num_reqs < 2:
            return None
        saved_per_pos = (num_reqs - 1) * self.num_kv_heads * self.head_dim  # K elements not re-read per position
        min_len = max(self.min_shared_len, -(-self.min_saved_kv // saved_per_pos))
        if max_len < min_len:
            return None
        head = table[:, :max_len]
        same = (head == head[:1]).all(dim=0)  # [max_len]: column holds one slot in every request
        shared_len = int(same.int().cumprod(0).sum())  # leading run of such columns (one sync per group)
        if shared_len < min_len:
            return None
        return _SharedPrefix(shared_len, head[0, :shared_len].contiguous())

    def _decode_meta(self, fb: AttentionBatch) -> _DecodeMeta:
        nd = fb.num_decode
        seq_lens = fb.seq_lens_list[:nd]
        kv_len = max(seq_lens)
        table = fb.req_to_slot[fb.req_rows[:nd], :kv_len]  # [Bd, Ld]
        shared = self._shared_prefix(table, min(seq_lens) - 1)
        start = shared.kv_len if shared else 0
        k_pos = torch.arange(start, kv_len, device=fb.req_to_slot.device)
        kv_idx = table[:, start:]  # [Bd, Ld - S]
        mask = None
        if min(seq_lens) != kv_len:
            valid = k_pos[None, :] < fb.seq_lens[:nd, None]  # [Bd, Ld - S]
            kv_idx = kv_idx.masked_fill(~valid, 0)  # stale table entries past seq_len: any in-range slot
            mask = _additive(valid[:, None, None, :], fb.req_to_slot.device)
        return _DecodeMeta(nd, kv_len - start, kv_idx.reshape(-1), mask, shared)

    def _extend_meta(self, fb: AttentionBatch, lo: int, hi: int, q_start: int) -> _ExtendMeta:
        """Requests lo..hi-1 (extends), whose new tokens are rows q_start.. of T."""
        device = fb.req_to_slot.device
        seq_lens = fb.seq_lens_list[lo:hi]
        extend_lens = fb.extend_lens_list[lo:hi]
        num_reqs = len(seq_lens)
        q_len, kv_len = max(extend_lens), max(seq_lens)
        if num_reqs == 1 and seq_lens[0] == extend_lens[0]:
            # a fresh prompt: the new k/v are the whole KV, causal mask without materializing it
            return _ExtendMeta(1, q_start, q_len, q_len, kv_len, None, None, None, None)
        table = fb.req_to_slot[fb.req_rows[lo:hi], :kv_len]  # [Be, Lk]
        shared = self._shared_prefix(table, min(s - e for s, e in zip(seq_lens, extend_lens)))
        start = shared.kv_len if shared else 0
        prefix_lens = fb.prefix_lens[lo:hi, None]
        seq_lens_t = fb.seq_lens[lo:hi, None]
        q_pos = torch.arange(q_len, device=device)[None, :]  # [1, Lq]
        k_pos = torch.arange(start, kv_len, device=device)[None, :]  # [1, Lk - S]
        kv_valid = k_pos < seq_lens_t  # [Be, Lk - S]
        kv_idx = table[:, start:].masked_fill(~kv_valid, 0)
        # key j is visible to new token i when j <= prefix + i; padded query rows (i >= extend_len)
        # still see every real key, so no softmax row is empty (no NaNs), and they are dropped anyway.
        mask = (k_pos[:, None, :] <= (prefix_lens + q_pos)[:, :, None]) & kv_valid[:, None, :]  # [Be, Lq, Lk]
        q_idx = unpad_idx = None
        if num_reqs > 1:
            extend_lens_t = fb.extend_lens[lo:hi, None]
            q_valid = q_pos < extend_lens_t  # [Be, Lq]
            q_starts = fb.qo_indptr[lo:hi, None] - q_start  # rows relative to the group's first row
            q_idx = torch.where(q_valid, q_starts + q_pos, q_starts).reshape(-1)
            # the real tokens, in padded row-major order, are exactly T's order
            unpad_idx = torch.nonzero(q_valid.reshape(-1)).squeeze(1)
        return _ExtendMeta(num_reqs, q_start, sum(extend_lens), q_len, kv_len - start, kv_idx.reshape(-1), q_idx,
                           unpad_idx,
                           _additive(mask[:, None], device), shared)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, fb: AttentionBatch, scale: float) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]. Writes k/v into the caches at fb.out_slots first."""
        meta: TorchAttentionMeta = fb.attn_meta
        k_cache.index_copy_(0, fb.out_slots, k)
        v_cache.index_copy_(0, fb.out_slots, v)
        if meta.k_buf is None:
            # groups run one after the other, so one workspace of the largest need serves them all
            size = max([_gather_rows(meta.decode)] + [_gather_rows(e) for e in meta.extends])
            meta.k_buf = k_cache.new_empty((size, self.num_kv_heads, self.head_dim))
            meta.v_buf = torch.empty_like(meta.k_buf)
        outs = []
        if meta.decode is not None:
            outs.append(self._decode(q[:meta.decode.num_reqs], k_cache, v_cache, meta, scale))
        for e in meta.extends:
            rows = slice(e.q_start, e.q_start + e.num_tokens)
            outs.append(self._extend(q[rows], k[rows], v[rows], k_cache, v_cache, meta, e, scale))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _gather(self, k_cache, v_cache, meta: TorchAttentionMeta, idx: torch.Tensor, num_reqs: int, kv_len: int,
                offset: int = 0):
        n = idx.shape[0]
        k = torch.index_select(k_cache, 0, idx, out=meta.k_buf[offset:offset + n])
        v = torch.index_select(v_cache, 0, idx, out=meta.v_buf[offset:offset + n])
        shape = (num_reqs, kv_len, self.num_kv_heads, self.head_dim)
        return k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)  # [B, Hkv, L, D] views

    def _attend_shared(self, q, k_cache, v_cache, meta: TorchAttentionMeta, shared: _SharedPrefix, scale: float):
        """All of a group's query rows q [N, Hq, D] against its shared prefix, which precedes every one of
        them: no mask. Gathers into the workspace's first S rows.
        -> (out [N, Hkv, G, D], lse [N, Hkv, G]) strided views."""
        k, v = self._gather(k_cache, v_cache, meta, shared.kv_idx, 1, shared.kv_len)  # [1, Hkv, S, D]
        n = q.shape[0]
        # the G q heads of a kv head become N * G rows against it: each K/V block is packed once, not G
        # times (3x faster than q heads as heads in bf16 at small N)
        qg = q.view(n, self.num_kv_heads, self.group, self.head_dim).transpose(0, 1)  # [Hkv, N, G, D]
        out, lse = _attend_lse(qg.reshape(1, self.num_kv_heads, n * self.group, self.head_dim), k, v, None, scale)
        out = out.view(self.num_kv_heads, n, self.group, self.head_dim).transpose(0, 1)
        return out, lse.view(self.num_kv_heads, n, self.group).transpose(0, 1)

    def _decode(self, q, k_cache, v_cache, meta: TorchAttentionMeta, scale: float) -> torch.Tensor:
        d = meta.decode
        offset = d.shared.kv_len if d.shared else 0
        k, v = self._gather(k_cache, v_cache, meta, d.kv_idx, d.num_reqs, d.kv_len, offset)
        # GQA without repeating K/V: the `group` q heads sharing a kv head act as `group` query rows
        qg = q.reshape(d.num_reqs, self.num_kv_heads, self.group, self.head_dim)  # [Bd, Hkv, G, D]
        if d.mask is not None and d.mask.dtype != q.dtype:
            d.mask = d.mask.to(q.dtype)
        shape = (d.num_reqs, self.num_q_heads, self.head_dim)  # (Hkv, G) flattens to q head order
        if d.shared is None:
            return F.scaled_dot_product_attention(qg, k, v, attn_mask=d.mask, scale=scale).reshape(shape)
        out, lse = _attend_lse(qg, k, v, d.mask, scale)  # [Bd, Hkv, G, D], [Bd, Hkv, G]
        return _merge(out, lse, *self._attend_shared(q, k_cache, v_cache, meta, d.shared, scale)).reshape(shape)

    def _extend(self, q, k_new, v_new, k_cache, v_cache, meta: TorchAttentionMeta, e: _ExtendMeta,
                scale: float) -> torch.Tensor:
        if e.kv_idx is None:  # one fresh prompt
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k_new.transpose(0, 1)[None],
                                                 v_new.transpose(0, 1)[None], is_causal=True, scale=scale,
                                                 enable_gqa=self.group > 1)
            return out[0].transpose(0, 1)  # [Te, Hq, D]
        offset = e.shared.kv_len if e.shared else 0
        k, v = self._gather(k_cache, v_cache, meta, e.kv_idx, e.num_reqs, e.kv_len, offset)
        if e.q_idx is None:
            qp = q.transpose(0, 1)[None]  # [1, Hq, Te, D]
        else:
            qp = torch.index_select(q, 0, e.q_idx).view(e.num_reqs, e.q_len, self.num_q_heads, self.head_dim)
            qp = qp.transpose(1, 2)  # [Be, Hq, Lq, D]
        if e.mask.dtype != q.dtype:
            e.mask = e.mask.to(q.dtype)
        if e.shared is None:
            out = F.scaled_dot_product_attention(qp, k, v, attn_mask=e.mask, scale=scale, enable_gqa=self.group > 1)
            return self._unpad(out, e)
        out, lse = _attend_lse(qp, k, v, e.mask, scale)  # [Be, Hq, Lq, D], [Be, Hq, Lq]
        grouped = (-1, self.num_kv_heads, self.group)  # [Te, Hq, ...] -> [Te, Hkv, G, ...]
        out = self._unpad(out, e).reshape(*grouped, self.head_dim)
        lse = self._unpad(lse[..., None], e).reshape(grouped)
        out = _merge(out, lse, *self._attend_shared(q, k_cache, v_cache, meta, e.shared, scale))
        return out.reshape(-1, self.num_q_heads, self.head_dim)

    def _unpad(self, out: torch.Tensor, e: _ExtendMeta) -> torch.Tensor:
        """[Be, H, Lq, X] padded per-request rows -> [Te, H, X] rows of T."""
        out = out.transpose(1, 2)  # [Be, Lq, H, X]
        if e.unpad_idx is None:
            return out[0]
        return torch.index_select(out.reshape(e.num_reqs * e.q_len, *out.shape[2:]), 0, e.unpad_idx)


def _extend_runs(extend_lens: list[int], num_decode: int) -> list[tuple[int, int]]:
    """Split requests num_decode.. into consecutive runs of short (<= SHORT_EXTEND_LEN new tokens) and
    long extends: each run is padded to its own longest request, so a jump-forward draft or a
    one-token resume beside a 512-token prefill chunk is not padded to 512 query rows."""
    runs: list[tuple[int, int]] = []
    for i in range(num_decode, len(extend_lens)):
        short = extend_lens[i] <= SHORT_EXTEND_LEN
        if runs and (extend_lens[runs[-1][0]] <= SHORT_EXTEND_LEN) == short:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _gather_rows(group: _DecodeMeta | _ExtendMeta | None) -> int:
    """Workspace rows a group's gathers need: its shared prefix, then every request's own part."""
    if group is None or group.kv_idx is None:
        return 0
    return (group.shared.kv_len if group.shared else 0) + group.num_reqs * group.kv_len
