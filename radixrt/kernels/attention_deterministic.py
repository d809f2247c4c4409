"""Batch-invariant paged attention (--enable-deterministic-inference): a query row's output is
bitwise the same whatever else shares its step, whether its prefix was computed in this step, an
earlier one or another request's, and however its prompt was chunked.

Why a kernel of its own: the CPU flash kernel's result for a row changes with the number of query
rows it is given (and in float32 with the batch and the row's place in it), and the cascade and the
split-prefix paths of attention_torch.py reduce a row's keys in an order that is the batch's. Here
every row, decode or prompt, is reduced the same way:

  keys      in absolutely aligned chunks of KV_CHUNK positions (chunk c holds positions
            c*C .. c*C+C-1 of the row's request), each a fixed-shape float32 matmul
  queries   in tiles of TILE_POSITIONS absolutely aligned positions of one request (times the G
            q heads of a kv head), positions this step does not compute padded with zeros, so a
            row always sits at the same place of a tile of the same shape
  merge     the chunks' partial softmaxes folded in chunk order by elementwise ops; a chunk whose
            keys a row cannot see folds in as an exact identity (factor 1, term 0), so how many
            chunks a step walks (its longest request) changes nothing

Everything is computed in float32 from the pool (exact up-casts of a bf16 pool) and rounded once to
q's dtype. What it costs against the default backend: benchmarks/bench_deterministic.py.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from radixrt.kernels.attention_batch import AttentionBatch
from radixrt.kernels.kv_quant import LayerKV

KV_CHUNK = 256
TILE_POSITIONS = 4
# a request with at least this many tiles in a step is a group of its own: its tiles read each key
# chunk once, broadcast to all of them, instead of a gathered copy per tile
OWN_GROUP_TILES = 8


@dataclass
class KVChunk:
    """Chunk c of the keys for tiles first .. first + num_tiles - 1 of a group."""

    first: int
    num_tiles: int
    kv_idx: torch.Tensor  # [num_tiles * C], or [C] for a one-request group (masked: slot 0)
    # [num_tiles, 1, P, 1, C] additive float32: 0 visible, -inf not; None: every tile position sees
    # every key of the chunk (adding zeros is exact, so skipping it changes no bit)
    mask: torch.Tensor | None


@dataclass
class TileGroup:
    tile_rows: torch.Tensor  # [num_tiles * P] rows of q per tile position (T: a zero row)
    chunks: list[KVChunk]
    one_request: bool  # every tile is one request's: each chunk's keys are read once

    @property
    def num_tiles(self) -> int:
        return self.tile_rows.shape[0] // TILE_POSITIONS


@dataclass
class DeterministicMeta:
    groups: list[TileGroup]
    out_rows: torch.Tensor  # [T] the row of each token in the groups' concatenated tile positions
    k_buf: torch.Tensor | None = None  # gather workspace reused by every layer
    v_buf: torch.Tensor | None = None
    k_buf32: torch.Tensor | None = None  # the same rows in float32 (a low-precision pool)
    v_buf32: torch.Tensor | None = None


def plan(fb: AttentionBatch, window: int | None = None) -> DeterministicMeta:
    """The tiles and chunks of a batch (every layer of the forward reuses them). window: keys
    more than window - 1 positions before a query are masked too."""
    P = TILE_POSITIONS
    seq = fb.seq_lens_list
    first_tile = [(s - e) // P for s, e in zip(seq, fb.extend_lens_list)]
    num_tiles = [(s - 1) // P - k + 1 for s, k in zip(seq, first_tile)]
    own = [b for b, n in enumerate(num_tiles) if n >= OWN_GROUP_TILES]
    rest = [b for b, n in enumerate(num_tiles) if n < OWN_GROUP_TILES]
    groups = [_group(fb, rest, first_tile, num_tiles, window, False)] if rest else []
    groups += [_group(fb, [b], first_tile, num_tiles, window, True) for b in own]
    flat = torch.cat([g.tile_rows for g in groups])
    num_rows = sum(fb.extend_lens_list)
    real_at = torch.nonzero(flat < num_rows).squeeze(1)
    out_rows = torch.empty(num_rows, dtype=torch.int64, device=flat.device)
    out_rows[flat[real_at]] = real_at
    return DeterministicMeta(groups, out_rows)


def _group(fb, reqs, first_tile, num_tiles, window, one_request: bool) -> TileGroup:
    """The tiles of requests reqs (their indices in fb), sorted by last position, longest first
    (a one-request group: ascending), so the tiles that reach a chunk are a prefix (a suffix)."""
    device = fb.req_to_slot.device
    P, C = TILE_POSITIONS, KV_CHUNK
    counts = [num_tiles[b] for b in reqs]
    own = torch.repeat_interleave(
        torch.arange(len(reqs), device=device), torch.tensor(counts, device=device)
    )  # each tile's index into reqs
    req = torch.tensor(reqs, device=device)[own]
    starts = torch.tensor([0] + counts[:-1], device=device).cumsum(0)
    firsts = torch.tensor([first_tile[b] for b in reqs], device=device)
    tile_k = torch.arange(sum(counts), device=device) - starts[own] + firsts[own]
    pos = tile_k[:, None] * P + torch.arange(P, device=device)  # [NT, P] absolute positions
    prefix, seq = fb.prefix_lens[req, None], fb.seq_lens[req, None]
    real = (pos >= prefix) & (pos < seq)
    rows = torch.where(real, fb.qo_indptr[req, None] + pos - prefix, sum(fb.extend_lens_list))
    last = torch.minimum(tile_k * P + P - 1, fb.seq_lens[req] - 1)
    if not one_request:
        order = torch.sort(last, descending=True, stable=True).indices
        req, pos, real, rows, last = req[order], pos[order], real[order], rows[order], last[order]
    last_list = last.tolist()  # the group's one sync
    # padded positions keep their absolute positions: their zero query rows' outputs are dropped
    table = fb.req_to_slot[fb.req_rows[req[:1] if one_request else req]]  # [NT or 1, width]
    chunks = []
    negated = [-x for x in last_list]  # ascending where last_list descends
    for c in range(max(last_list) // C + 1):
        keys = torch.arange(c * C, c * C + C, device=device)  # [C]
        if one_request:  # ascending: the tiles from the first that reaches chunk c on
            first = bisect.bisect_left(last_list, c * C)
            n = len(last_list) - first
        else:  # descending: the first n tiles
            first, n = 0, bisect.bisect_right(negated, -c * C)
        rows_c = table if one_request else table[:n]  # the slot rows this chunk reads
        seq_c = fb.seq_lens[req[first : first + rows_c.shape[0]], None]
        slots = rows_c.gather(1, keys.clamp(max=table.shape[1] - 1).expand(rows_c.shape[0], C))
        kv_idx = torch.where(keys[None, :] < seq_c, slots, 0).reshape(-1)
        tile_pos = pos[first : first + n, :, None]
        visible = keys[None, None, :] <= tile_pos  # [n, P, C]
        if window is not None:
            visible &= keys[None, None, :] > tile_pos - window
        mask = None
        if not bool(visible.all()):  # one sync per chunk per forward
            mask = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))
            mask = mask[:, None, :, None, :]
        chunks.append(KVChunk(first, n, kv_idx, mask))
    return TileGroup(rows.reshape(-1), chunks, one_request)


class DeterministicAttentionBackend:
    """The attention backend interface of attention_torch.TorchAttentionBackend, batch-invariant."""

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int):
        if num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}"
            )
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.group = num_q_heads // num_kv_heads

    def init_forward_metadata(self, fb: AttentionBatch) -> None:
        fb.attn_meta = plan(fb)

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
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D] (see TorchAttentionBackend.forward)."""
        meta: DeterministicMeta = fb.attn_meta
        if window is not None:
            if fb.window_meta is None:
                fb.window_meta = plan(fb, window)
            meta = fb.window_meta
        k_cache, v_cache = LayerKV(k_cache, k_scale), LayerKV(v_cache, v_scale)
        k_cache.write(fb.out_slots, k)
        v_cache.write(fb.out_slots, v)
        if meta.k_buf is None:
            dtype = q.dtype if k_cache.quantized else k_cache.values.dtype
            rows = max(ch.kv_idx.shape[0] for g in meta.groups for ch in g.chunks)
            meta.k_buf = q.new_empty((rows, self.num_kv_heads, self.head_dim), dtype=dtype)
            meta.v_buf = torch.empty_like(meta.k_buf)
            if dtype != torch.float32:  # each chunk's K/V widened into these, not new tensors
                meta.k_buf32 = torch.empty_like(meta.k_buf, dtype=torch.float32)
                meta.v_buf32 = torch.empty_like(meta.k_buf32)
        # the scale folded into q once per layer (not into every chunk's scores)
        q_ext = torch.cat((q.float() * scale, q.new_zeros((1, *q.shape[1:]), dtype=torch.float32)))
        outs = [self._attend(q_ext, k_cache, v_cache, meta, g, softcap) for g in meta.groups]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.index_select(0, meta.out_rows).to(q.dtype)

    def _attend(self, q_ext, k_cache, v_cache, meta, g: TileGroup, softcap):
        """One group's tiles -> [num_tiles * P, Hq, D] float32, one row per tile position."""
        NT, Hkv, G, D, P = g.num_tiles, self.num_kv_heads, self.group, self.head_dim, TILE_POSITIONS
        rows = P * G
        # [Hkv, NT, rows, D]: per kv head, each tile's P positions times its G q heads
        qt = q_ext.index_select(0, g.tile_rows).view(NT, P, Hkv, G, D)
        qt = qt.permute(2, 0, 1, 3, 4).reshape(Hkv, NT, rows, D)
        m = qt.new_full((Hkv, NT, rows), float("-inf"))
        l_sum = torch.zeros_like(m)
        o = torch.zeros_like(qt)
        for ch in g.chunks:
            lo, n = ch.first, ch.num_tiles
            here = slice(lo, lo + n)
            kc, vc = (
                _widened(cache, ch.kv_idx, buf, buf32).view(-1, KV_CHUNK, Hkv, D)
                for cache, buf, buf32 in (
                    (k_cache, meta.k_buf, meta.k_buf32),
                    (v_cache, meta.v_buf, meta.v_buf32),
                )
            )
            s = qt.new_empty((Hkv, n, rows, KV_CHUNK))
            for h in range(Hkv):  # one fixed-shape matmul per tile; K/V strided, never copied
                torch.bmm(qt[h, here], kc[:, :, h].expand(n, -1, -1).transpose(1, 2), out=s[h])
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            if ch.mask is not None:
                s = s.view(Hkv, n, P, G, -1).add_(ch.mask.view(1, n, P, 1, -1)).view(s.shape)
            m_c = s.amax(-1)
            p = s.sub_(_finite(m_c)[..., None]).exp_()
            o_c = torch.empty_like(o[:, here])
            for h in range(Hkv):
                torch.bmm(p[h], vc[:, :, h].expand(n, -1, -1), out=o_c[h])
            m_new = torch.maximum(m[:, here], m_c)
            base = _finite(m_new)
            keep, add = torch.exp(m[:, here] - base), torch.exp(m_c - base)
            l_sum[:, here] = l_sum[:, here] * keep + p.sum(-1) * add
            o[:, here] = o[:, here] * keep[..., None] + o_c * add[..., None]
            m[:, here] = m_new
        out = (o / l_sum[..., None]).view(Hkv, NT, P, G, D).permute(1, 2, 0, 3, 4)
        return out.reshape(NT * P, Hkv * G, D)


def _widened(
    cache: LayerKV, idx: torch.Tensor, buf: torch.Tensor, buf32: torch.Tensor | None
) -> torch.Tensor:
    """The rows idx of cache in float32 (exact: a bf16 or fp16 value widens without rounding)."""
    n = idx.shape[0]
    rows = cache.select(idx, buf[:n])
    return rows if buf32 is None else buf32[:n].copy_(rows)


def _finite(m: torch.Tensor) -> torch.Tensor:
    """A row maximum with -inf (no visible key yet) as 0: exp(-inf - 0) is then 0, not NaN."""
    return torch.where(m == float("-inf"), 0.0, m)
