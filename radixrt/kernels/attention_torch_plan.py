"""How the torch attention backend lays a batch out, once per forward (all layers reuse it).

Each group (the decode requests; runs of short and of long extends) is padded into dense [B, L]
slot-index matrices, with an additive mask where lengths differ. A group whose requests read the
same pool slots for their first S positions gets a shared prefix (the cascade: attention_torch.py
attends to it once for the whole group). A single long chunk after its own cached prefix is split
into "prefix, unmasked" + "itself, causal" instead of one masked call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention_batch import AttentionBatch

# The cascade's second attention call and merge cost a fixed ~0.1-0.2 ms a layer on one core; it
# pays off once the K/V it spares re-reading, (B - 1) * S * Hkv * D, is above about 512 positions at
# SmolLM2's 3 x 64 (benchmarks/bench_attention_cpu.py). Short shared runs are not worth the merge.
CASCADE_MIN_SHARED_LEN = 32
CASCADE_MIN_SAVED_KV = 512 * 3 * 64
# Extends of at most this many new tokens (jump-forward drafts, resumed or cached-prompt tails) are
# padded in a group of their own, apart from long prefill chunks.
SHORT_EXTEND_LEN = 32


def _additive(visible: torch.Tensor, device) -> torch.Tensor:
    """0 / -inf float mask: SDPA would otherwise convert a bool mask again in every layer.
    Made float32 here; the first layer casts it to the model dtype once."""
    return torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))


@dataclass
class SharedPrefix:
    """Positions 0..kv_len-1 read the same pool slots in every request of a group, before every new
    token."""

    kv_len: int  # S
    kv_idx: torch.Tensor  # [S] pool slots
    # set when kv_idx is first_slot, first_slot + 1, ...: read in place, no gather
    first_slot: int | None = None


@dataclass
class DecodeMeta:
    """The decode group: decode requests, and the short extends after a cached prefix that follow
    them (drafts to verify, cached-prompt tails). They attend in one call to their shared prefix and
    one call to their own positions, with the G q heads of a kv head as query rows (no K/V
    repeat)."""

    num_reqs: int  # rows, one per new token (a request feeding k tokens has k): the group
    # owns the first num_reqs rows of T
    kv_len: int  # Ld: longest KV in the group (own part: minus S)
    kv_idx: torch.Tensor  # [rows * Ld] pool slots (padding points at a valid slot, masked)
    mask: torch.Tensor | None  # [rows, 1, 1, Ld] additive, None when every row sees all Ld keys
    shared: SharedPrefix | None = None  # set: kv_len/kv_idx/mask cover only positions S..


@dataclass
class ExtendMeta:
    num_reqs: int
    q_start: int  # first row of the group in T
    num_tokens: int  # Te: rows of T the group owns
    q_len: int  # Lq: longest extend in the group
    kv_len: int  # Lk: longest KV in the group (own part: minus S)
    kv_idx: torch.Tensor | None  # [Be * Lk] pool slots; None: attend to the new k/v directly
    q_idx: torch.Tensor | None  # [Be * Lq] rows of T to pad q into; None: no padding needed
    unpad_idx: torch.Tensor | None  # [Te] rows of the padded [Be * Lq] output that are real tokens
    mask: torch.Tensor | None  # [Be, 1, Lq, Lk] additive; None: plain causal (is_causal)
    shared: SharedPrefix | None = None  # set: kv_len/kv_idx/mask cover only positions S..
    # one long chunk after its own cached prefix (CPU): kv_idx holds the prefix only; the new tokens
    # attend to it unmasked and to themselves causally, merged by log-sum-exp. Both calls are the
    # flash kernel's fast paths: no mask is built, no block is computed only to be masked.
    split_prefix: bool = False


@dataclass
class TorchAttentionMeta:
    decode: DecodeMeta | None
    extends: list[ExtendMeta]  # consecutive runs of short / long extends, each padded on its own
    k_buf: torch.Tensor | None = None  # gather workspaces reused by every layer of this forward
    v_buf: torch.Tensor | None = None


class TorchAttentionPlanner:
    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        min_shared_len: int | None = CASCADE_MIN_SHARED_LEN,
        min_saved_kv: int = CASCADE_MIN_SAVED_KV,
    ):
        """The cascade is taken for a group whose shared prefix S >= min_shared_len and whose
        (num_reqs - 1) * S * num_kv_heads * head_dim >= min_saved_kv; min_shared_len None: never."""
        if min_shared_len is not None and min_shared_len < 1:
            raise ValueError(f"min_shared_len must be >= 1 or None, got {min_shared_len}")
        if min_saved_kv < 0:
            raise ValueError(f"min_saved_kv must be >= 0, got {min_saved_kv}")
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.min_shared_len = min_shared_len
        self.min_saved_kv = min_saved_kv
        self.window: int | None = None  # the window of the plan being made

    def plan(self, fb: AttentionBatch, window: int | None = None) -> TorchAttentionMeta:
        """The layout of fb's attention (init_forward_metadata stores it as fb.attn_meta). window:
        for sliding-window layers, keys more than window - 1 positions before a query are masked
        too; the plan then takes the general masked paths (no shared-prefix cascade, no unmasked
        fast paths)."""
        self.window = window
        num_decode = fb.num_decode
        # the first run, if any, starts at num_decode
        runs = _extend_runs(fb.extend_lens_list, num_decode)
        group_end = num_decode
        if (
            runs
            and fb.extend_lens_list[num_decode] <= SHORT_EXTEND_LEN
            and all(fb.seq_lens_list[i] > fb.extend_lens_list[i] for i in range(*runs[0]))
        ):
            # short extends after a cached prefix join the decodes: a step verifying drafts then
            # makes one shared-prefix call and one own call, not two of each (a verify step costs ~a
            # decode step)
            group_end = runs.pop(0)[1]
        decode = self._decode_meta(fb, group_end) if group_end else None
        extends = []
        q_start = decode.num_reqs if decode else 0
        for lo, hi in runs:
            extends.append(self._extend_meta(fb, lo, hi, q_start))
            q_start += sum(fb.extend_lens_list[lo:hi])
        return TorchAttentionMeta(decode, extends)

    def _shared_prefix(self, table: torch.Tensor, max_len: int) -> SharedPrefix | None:
        """table [B, L]: a group's slots by position; max_len: its shortest prefix_len, so that
        every new token comes after the shared part (which then needs no mask)."""
        num_reqs = table.shape[0]
        if self.min_shared_len is None or num_reqs < 2 or self.window is not None:
            return None
        # K elements not re-read per position
        saved_per_pos = (num_reqs - 1) * self.num_kv_heads * self.head_dim
        min_len = max(self.min_shared_len, -(-self.min_saved_kv // saved_per_pos))
        if max_len < min_len:
            return None
        head = table[:, :max_len]
        same = (head == head[:1]).all(dim=0)  # [max_len]: column holds one slot in every request
        # leading run of such columns (one sync per group)
        shared_len = int(same.int().cumprod(0).sum())
        if shared_len < min_len:
            return None
        kv_idx = head[0, :shared_len].contiguous()
        # a prefix prefilled in one go usually sits in consecutive slots: attention then reads the
        # pool itself instead of a gathered copy (one sync per group per forward, ~20 us a layer
        # saved)
        first = int(kv_idx[0])
        consecutive = bool(
            (kv_idx == torch.arange(first, first + shared_len, device=kv_idx.device)).all()
        )
        return SharedPrefix(shared_len, kv_idx, first if consecutive else None)

    def _decode_meta(self, fb: AttentionBatch, nd: int) -> DecodeMeta:
        """Requests 0..nd-1: the decodes and the short extends that joined them. Every new token is
        a row of its own (its request's own keys, up to its position), so a verify step costs per
        real token, with no query padding; the shared prefix is detected per request."""
        device = fb.req_to_slot.device
        seq_lens = fb.seq_lens_list[:nd]
        extend_lens = fb.extend_lens_list[:nd]
        kv_len = max(seq_lens)
        table = fb.req_to_slot[fb.req_rows[:nd], :kv_len]  # [Bd, Ld]
        shared = self._shared_prefix(table, min(s - e for s, e in zip(seq_lens, extend_lens)))
        start = shared.kv_len if shared else 0
        k_pos = torch.arange(start, kv_len, device=device)
        num_tokens = sum(extend_lens)
        if num_tokens == nd:  # decodes only: a row per request, its last position the newest
            kv_idx = table[:, start:]  # [Bd, Ld - S]
            mask = None
            if min(seq_lens) != kv_len or (self.window is not None and kv_len > self.window):
                valid = k_pos[None, :] < fb.seq_lens[:nd, None]  # [Bd, Ld - S]
                if self.window is not None:
                    valid &= k_pos[None, :] >= fb.seq_lens[:nd, None] - self.window
                # stale table entries past seq_len: any in-range slot
                kv_idx = kv_idx.masked_fill(~valid, 0)
                mask = _additive(valid[:, None, None, :], device)
            return DecodeMeta(nd, kv_len - start, kv_idx.reshape(-1), mask, shared)
        # [Tg]
        row_req = torch.repeat_interleave(torch.arange(nd, device=device), fb.extend_lens[:nd])
        row_pos = (
            fb.prefix_lens[row_req]
            + torch.arange(num_tokens, device=device)
            - fb.qo_indptr[row_req]
        )
        visible = k_pos[None, :] <= row_pos[:, None]  # [Tg, Ld - S]: up to the row's own position
        if self.window is not None:
            visible &= k_pos[None, :] > row_pos[:, None] - self.window
        kv_idx = table[row_req, start:].masked_fill(~visible, 0)
        return DecodeMeta(
            num_tokens,
            kv_len - start,
            kv_idx.reshape(-1),
            _additive(visible[:, None, None, :], device),
            shared,
        )

    def _extend_meta(self, fb: AttentionBatch, lo: int, hi: int, q_start: int) -> ExtendMeta:
        """Requests lo..hi-1 (extends), whose new tokens are rows q_start.. of T."""
        device = fb.req_to_slot.device
        seq_lens = fb.seq_lens_list[lo:hi]
        extend_lens = fb.extend_lens_list[lo:hi]
        num_reqs = len(seq_lens)
        q_len, kv_len = max(extend_lens), max(seq_lens)
        if num_reqs == 1 and seq_lens[0] == extend_lens[0] and self.window is None:
            # a fresh prompt: the new k/v are the whole KV, causal mask without materializing it
            return ExtendMeta(1, q_start, q_len, q_len, kv_len, None, None, None, None)
        table = fb.req_to_slot[fb.req_rows[lo:hi], :kv_len]  # [Be, Lk]
        if (
            num_reqs == 1
            and q_len > SHORT_EXTEND_LEN
            and device.type == "cpu"
            and self.window is None
        ):
            prefix_len = seq_lens[0] - extend_lens[0]
            return ExtendMeta(
                1,
                q_start,
                q_len,
                q_len,
                prefix_len,
                table[0, :prefix_len].contiguous(),
                None,
                None,
                None,
                split_prefix=True,
            )
        shared = self._shared_prefix(table, min(s - e for s, e in zip(seq_lens, extend_lens)))
        start = shared.kv_len if shared else 0
        prefix_lens = fb.prefix_lens[lo:hi, None]
        seq_lens_t = fb.seq_lens[lo:hi, None]
        q_pos = torch.arange(q_len, device=device)[None, :]  # [1, Lq]
        k_pos = torch.arange(start, kv_len, device=device)[None, :]  # [1, Lk - S]
        kv_valid = k_pos < seq_lens_t  # [Be, Lk - S]
        kv_idx = table[:, start:].masked_fill(~kv_valid, 0)
        # key j is visible to new token i when j <= prefix + i; padded query rows (i >= extend_len)
        # still see every real key, so no softmax row is empty (no NaNs) -- except under a sliding
        # window, where a padded row may see none: its NaNs stay in that row, which unpad_idx drops.
        # [Be, Lq, Lk]
        mask = (k_pos[:, None, :] <= (prefix_lens + q_pos)[:, :, None]) & kv_valid[:, None, :]
        if self.window is not None:
            mask &= k_pos[:, None, :] > (prefix_lens + q_pos)[:, :, None] - self.window
        q_idx = unpad_idx = None
        if num_reqs > 1:
            extend_lens_t = fb.extend_lens[lo:hi, None]
            q_valid = q_pos < extend_lens_t  # [Be, Lq]
            q_starts = fb.qo_indptr[lo:hi, None] - q_start  # rows relative to the group's first row
            q_idx = torch.where(q_valid, q_starts + q_pos, q_starts).reshape(-1)
            # the real tokens, in padded row-major order, are exactly T's order
            unpad_idx = torch.nonzero(q_valid.reshape(-1)).squeeze(1)
        return ExtendMeta(
            num_reqs,
            q_start,
            sum(extend_lens),
            q_len,
            kv_len - start,
            kv_idx.reshape(-1),
            q_idx,
            unpad_idx,
            _additive(mask[:, None], device),
            shared,
        )


def _extend_runs(extend_lens: list[int], num_decode: int) -> list[tuple[int, int]]:
    """Split requests num_decode.. into consecutive runs of short (<= SHORT_EXTEND_LEN new tokens)
    and long extends: each run is padded to its own longest request, so a jump-forward draft or a
    one-token resume beside a 512-token prefill chunk is not padded to 512 query rows."""
    runs: list[tuple[int, int]] = []
    for i in range(num_decode, len(extend_lens)):
        short = extend_lens[i] <= SHORT_EXTEND_LEN
        if runs and (extend_lens[runs[-1][0]] <= SHORT_EXTEND_LEN) == short:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def gather_rows(group: DecodeMeta | ExtendMeta | None) -> int:
    """Workspace rows a group's gathers need: its shared prefix, then every request's own part."""
    if group is None or group.kv_idx is None:
        return 0
    return (group.shared.kv_len if group.shared else 0) + group.num_reqs * group.kv_len
