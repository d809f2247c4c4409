"""A request inside the scheduler. It owns its memory state: no side tables by rid.

Tokens of a request are `fill_ids = origin_input_ids + output_ids`. The first `kv_len`
of them have KV stored in the pages `page_ids` (token i lives in slot
`page_ids[i // page_size] * page_size + i % page_size`). The first `cached_len` of those
are borrowed, read-only, from the radix tree and locked through `last_node`; the rest
the request wrote itself.
"""

from __future__ import annotations

import time
from typing import Any

from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.request.sampling_params import SamplingParams


class Req:
    # prefill-decode disaggregation (scheduler_pd.py), set on the instance when they change:
    # prefill: how it ends once its pages are sent (set when handed off to the transfer);
    # decode: aborted while its KV was in flight
    pd_reason: FinishReason | None = None
    pd_abort: FinishReason | None = None

    def __init__(
        self,
        rid: str,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        program_id: str | None = None,
        arrival_time: float | None = None,
    ):
        self.rid = rid
        self.origin_input_ids = list(input_ids)
        self.output_ids: list[int] = []
        self.sampling = sampling
        self.return_logprob = return_logprob
        self.logprob_start_len = logprob_start_len
        self.top_logprobs_num = top_logprobs_num
        self.stream = stream
        self.program_id = program_id
        self.pin_ttl_s: float | None = None  # pin the prompt in the tree when finished
        self.session_id: Any = None  # a session's turn, pinned when finished (session_key)
        self.arrival_time = time.time() if arrival_time is None else arrival_time

        # memory
        self.page_ids: list[int] = []
        self.kv_len = self.cached_len = 0
        self.last_node: Any = None  # radix node locked on our behalf
        self.table_row: int | None = None  # row of the req->slot table while running
        self.table_stale = False  # page_ids changed under the row (shared with the tree): rewrite
        self.beam: Any = None  # the BeamGroup (beam_group.py) this request is a beam of
        self.beam_logprob = 0.0  # that beam's cumulative logprob
        self.pending_copies: list[tuple[int, int]] = []  # (page, own page) before its next forward
        self.lora: str | None = None  # its LoRA adapter (None: the base model)
        self.lora_slot: int | None = None  # the adapter's slot while running (lora_slots.py)
        self.key_offset = 0  # its (adapter, cache_salt) namespace in the tree (namespaces.py)
        self.bootstrap: Any = None  # disaggregated: where its KV comes from / goes (pd_link.py)

        # progress and results
        self.prefix_hit_len = 0  # cached tokens on first admission (reported as cached_tokens)
        self.admitted = False
        self.num_preemptions = 0
        self.finished_reason: FinishReason | None = None
        self.num_sent = 0  # output ids already sent out as deltas
        self.grammar: Any = None  # GrammarState while constrained
        self.grammar_future: Any = None  # its grammar's compile in flight (a Future): it waits
        self.stop_matcher: Any = None  # an IncrementalDetokenizer over output_ids (stop strings)
        # jump-forward: tokens the grammar forces after output_ids, fed for verification next decode
        self.draft_ids: list[int] = []
        self.draft_states: list[int] = []  # the grammar state after each draft token
        self.lookup: Any = None  # PromptLookup (n-gram drafts) once it decodes unconstrained
        self.error: str | None = None  # why it failed, for the client
        self.error_status = 400  # 400: refused as given; 500: failed inside the server
        self.output_logprobs: list[list[Any]] = []
        self.output_top_logprobs: list[list[list[Any]]] = []
        self.input_logprobs: list[list[Any]] | None = None
        self.input_top_logprobs: list[list[list[Any]]] | None = None
        self.input_logprobs_sent = False

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def tree_ids(self, ids: list[int]) -> list[int]:
        """ids as the radix tree keys them: in the namespace of the request's adapter and salt, so
        KV is never shared across either (the unsalted base model's keys are the token ids)."""
        return [t + self.key_offset for t in ids] if self.key_offset else ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def is_decoding(self) -> bool:
        """All tokens but the last have KV: the next step feeds one token."""
        return self.kv_len == self.seq_len - 1 and bool(self.output_ids)

    def __repr__(self) -> str:
        return (
            f"Req({self.rid!r}, in={len(self.origin_input_ids)}, out={len(self.output_ids)}, "
            f"kv={self.kv_len}, cached={self.cached_len})"
        )
