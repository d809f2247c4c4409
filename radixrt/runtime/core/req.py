"""A request inside the scheduler: its tokens, its lifecycle (one ReqStatus), its KV (one ReqKV
record) and its results.

Tokens of a request are `fill_ids = origin_input_ids + output_ids`. The first `kv.computed_len`
of them have KV stored in the pages `kv.page_ids` (token i lives in slot
`page_ids[i // page_size] * page_size + i % page_size`). The first `kv.borrowed_len` of those
are borrowed, read-only, from the radix tree and locked through `kv.last_node`; the rest the
request wrote itself.
"""

from __future__ import annotations

import enum
import functools
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.sessions import SessionKey, session_key
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sampling_params import SamplingParams

if TYPE_CHECKING:  # type names only: these modules import this one
    from radixrt.runtime.core.beam_group import BeamGroup
    from radixrt.runtime.core.prompt_lookup import PromptLookup
    from radixrt.runtime.core.tree_node import TreeNode


class ReqStatus(enum.Enum):
    WAITING_FOR_GRAMMAR = "waiting for its grammar"  # its constraint compiles off the loop
    WAITING = "waiting"  # queued for admission (new, or preempted)
    WAITING_FOR_KV = "waiting for its KV"  # decode server: pages registered, the KV on its way
    RUNNING = "running"  # holds pages and a table row, planned each step
    SENDING = "sending"  # prefill server: computed, pages held until the decode server has them
    FINISHED = "finished"


S = ReqStatus
TRANSITIONS: dict[ReqStatus, frozenset[ReqStatus]] = {
    S.WAITING_FOR_GRAMMAR: frozenset({S.WAITING, S.FINISHED}),
    S.WAITING: frozenset({S.RUNNING, S.WAITING_FOR_KV, S.FINISHED}),
    S.WAITING_FOR_KV: frozenset({S.RUNNING}),  # arrived, failed or aborted: it ends as running
    S.RUNNING: frozenset({S.WAITING, S.SENDING, S.FINISHED}),  # WAITING: preempted
    S.SENDING: frozenset({S.RUNNING}),  # sent or failed: it ends as running
    S.FINISHED: frozenset(),
}


class GrammarState(Protocol):
    """What core asks of a constrained request's grammar (constrained/state.py's GrammarState)."""

    def accept(self, token: int) -> None: ...
    def is_terminated(self) -> bool: ...
    def is_final(self) -> bool: ...
    def ends_at(self, state: int) -> bool: ...
    def draft(self, room: int) -> tuple[list[int], list[int]]: ...
    def fork(self, output_ids: list[int]) -> GrammarState: ...
    def for_budget(self, budget: int) -> Any: ...  # the mask source of its next pick
    def at(self, state: int, budget: int) -> Any: ...  # the mask source after a draft token


class StopMatcher(Protocol):
    """Stop strings and regexes over the output (request/incremental_detokenizer.py)."""

    finished: bool
    matched_stop: str | None

    def feed(self, token_ids: list[int]) -> None: ...


@dataclass
class ReqKV:
    """A request's memory: what ReqMemory moves and check_integrity() verifies."""

    page_ids: list[int] = field(default_factory=list)
    computed_len: int = 0  # positions whose KV is stored (in page_ids)
    borrowed_len: int = 0  # of those, the first ones read from the radix tree (whole pages)
    last_node: TreeNode | None = None  # the tree node locked on the request's behalf
    table_row: int | None = None  # its row of the req->slot table while it holds memory
    table_stale: bool = False  # page_ids changed under the row (shared with the tree): rewrite
    pending_copies: list[tuple[int, int]] = field(default_factory=list)  # (page, own page) to copy


class Req:
    def __init__(
        self,
        rid: str,
        input_ids: list[int],
        sampling: SamplingParams,
        options: RequestOptions | None = None,
        arrival_time: float | None = None,
    ):
        self.rid = rid
        self.origin_input_ids = list(input_ids)
        self.output_ids: list[int] = []
        self.sampling = sampling
        self.options = options or RequestOptions()
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.status = ReqStatus.WAITING
        self.kv = ReqKV()
        self.beam: BeamGroup | None = None  # the beam search this request is a beam of
        self.beam_logprob = 0.0  # that beam's cumulative logprob
        self.lora_slot: int | None = None  # its adapter's slot while running (lora_slots.py)
        self.key_offset = 0  # its (adapter, cache_salt) namespace in the tree (namespaces.py)

        # progress and results
        self.cached_tokens = 0  # tokens the cache supplied on first admission (usage's figure)
        self.admitted = False  # admitted at least once (a resumption is not counted again)
        self.num_preemptions = 0
        self.uncached_hint: int | None = None  # its prompt tokens not cached, as fair_share guessed
        self.spec_verify_ct = 0  # steps that verified a draft of it (meta_info, SGLang's name)
        self.spec_accepted = 0  # draft tokens the model agreed with
        self.spec_missed = 0  # verify steps that ended on a draft token the model disagreed with
        self.finished_reason: FinishReason | None = None
        self.num_sent = 0  # output ids already sent out as deltas
        self.grammar: GrammarState | None = None
        self.grammar_future: Future[GrammarState] | None = None  # its compile, in flight
        self.stop_matcher: StopMatcher | None = None
        # jump-forward: tokens the grammar forces after output_ids, fed for verification next decode
        self.draft_ids: list[int] = []
        self.draft_states: list[int] = []  # the grammar state after each draft token
        self.lookup: PromptLookup | None = None  # n-gram drafts once it decodes unconstrained
        self.error: str | None = None  # why it failed, for the client
        self.error_status = 400  # 400: refused as given; 500: failed inside the server
        self.output_logprobs: list[list[Any]] = []  # [logprob, id]
        self.output_top_logprobs: list[list[list[Any]]] = []
        self.input_logprobs: list[list[Any]] | None = None
        self.input_top_logprobs: list[list[list[Any]]] | None = None
        self.input_logprobs_sent = False

    def move_to(self, status: ReqStatus) -> None:
        """The one way a request changes status (a transition the lifecycle lacks is a bug)."""
        assert status in TRANSITIONS[self.status], f"{self}: {self.status.name} -> {status.name}"
        self.status = status
        self.uncached_hint = None  # (guessed again when it next waits: a preemption cached more)

    def wait_for_grammar(self, compile: Future[GrammarState]) -> None:
        """A new request's constraint compiles off the loop: it waits for it before admission."""
        assert self.status is ReqStatus.WAITING and not self.admitted, f"{self} is not new"
        self.grammar_future, self.status = compile, ReqStatus.WAITING_FOR_GRAMMAR

    def end(self, reason: FinishReason) -> None:
        self.move_to(ReqStatus.FINISHED)
        self.finished_reason = reason

    @property
    def logprob_start(self) -> int:
        """The first prompt position whose logprob is served (-1: none; options.logprob_start)."""
        return self.options.logprob_start

    @property
    def lora(self) -> str | None:
        return self.options.lora

    @functools.cached_property  # a salted key is a digest: made once, not at every use
    def session_key(self) -> SessionKey | None:
        """Its session's key (a tenant's session is its own), None when it is no session's turn."""
        o = self.options
        return None if o.session_id is None else session_key(o.session_id, o.cache_salt)

    @property
    def fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def tree_ids(self, ids: list[int]) -> list[int]:
        """ids as the radix tree keys them: in the namespace of the request's adapter and salt, so
        KV is never shared across either (the unsalted base model's keys are the token ids)."""
        return [t + self.key_offset for t in ids] if self.key_offset else ids

    @property
    def rows(self) -> int:
        """Table rows it runs in: one, a beam search its width (asked of the search's root)."""
        return self.sampling.beam_width if self.sampling.is_beam else 1

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED

    @property
    def is_decoding(self) -> bool:
        """All tokens but the last have KV: the next step feeds one token."""
        return self.kv.computed_len == self.seq_len - 1 and bool(self.output_ids)

    def __repr__(self) -> str:
        return (
            f"Req({self.rid!r}, {self.status.name}, in={len(self.origin_input_ids)}, "
            f"out={len(self.output_ids)}, computed={self.kv.computed_len}, "
            f"borrowed={self.kv.borrowed_len})"
        )
