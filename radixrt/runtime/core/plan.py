"""The seam between the scheduler and the model runner: the plan of one step (plain data), what the
runner returns, and the Runner interface the scheduler drives.

The runner turns a list of PlanItem into a ForwardBatch (tensors). Nothing here is a tensor, a
request or a grammar: the runner sees ids, table rows, slots and sampling rows; a constrained row
carries the index of its mask source, a list the scheduler passes beside the plan (StepPlan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from radixrt.runtime.request.sampling_params import SamplingParams

if TYPE_CHECKING:  # the plan holds requests only beside the items the runner sees
    from radixrt.runtime.config import ServerConfig
    from radixrt.runtime.core.req import Req
    from radixrt.runtime.core.tiered_cache import TierStore


@dataclass(frozen=True, kw_only=True)
class SampleRow:
    """One token to pick: how to sample it and what it may be."""

    params: SamplingParams
    output_ids: list[int]  # generated so far (penalties, seeded draws)
    prompt_ids: list[int]  # repetition_penalty covers prompt + output tokens, as HF does
    return_logprob: bool = False
    top_logprobs_num: int = 0
    blocked_ids: list[int] | None = None  # must not be picked (EOS before min_new_tokens, ...)
    # constrained decoding: index into the step's mask sources (Runner.run), None: unconstrained
    mask: int | None = None
    # beam search: return this many best (logprob, id) continuations (ItemResult.beam_offers)
    beam_candidates: int = 0


@dataclass(frozen=True, kw_only=True)
class PlanItem:
    """One request's part of a step. Built by keyword; crosses processes as a ForwardItem."""

    row: int  # the request's row of the req->slot table
    new_ids: list[int]  # tokens fed this step: fill_ids[computed_len : computed_len + len(new_ids)]
    computed_len: int  # positions whose KV is stored before the step (the request's computed_len)
    slots: list[int]  # pool slots of positions [write_start, computed_len + len(new_ids))
    write_start: int  # first position whose slot is (re)written into the table row
    logits_start: int | None = None  # prompt logprobs from this position on (None: last token)
    # tokens to pick: none (a prefill chunk that does not complete the prompt), one after the last
    # fed token, or with a draft one after the request's own last token and one after each draft
    # token (none after a draft token that ends the grammar)
    picks: tuple[SampleRow, ...] = ()
    num_draft: int = 0  # the last num_draft new_ids are a jump-forward draft to verify
    prompt_ids: list[int] = field(default_factory=list)  # the prompt (prompt logprobs score it)
    output_ids: list[int] = field(default_factory=list)  # fill_ids = prompt_ids + output_ids
    top_logprobs_num: int = 0  # top-n prompt logprobs per scored position
    # (source page, destination page): KV the runner copies before the forward (a forked sample's
    # first page of its own, filled from its donor's partial last prompt page: admission.py; a
    # forked beam's own pages, filled from its parent's: beam_group.py)
    page_copies: tuple[tuple[int, int], ...] = ()
    # the LoRA adapter of the request (None: the base model) and the slot the scheduler put it in
    # (core/lora_slots.py); the runner copies it there first when the slot held another
    lora: str | None = None
    lora_slot: int | None = None

    @property
    def logits_from(self) -> int | None:
        """First position whose logits the forward keeps (None: the last fed token's only): a draft
        wants every new position's, like prompt logprobs from computed_len on."""
        return self.computed_len if self.num_draft else self.logits_start


class ForwardItem(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """A PlanItem's part a forward needs: what tensor parallelism sends to the other ranks (they
    sample nothing, so picks stay behind). Fields by PlanItem's names."""

    row: int
    new_ids: list[int]
    computed_len: int
    slots: list[int]
    write_start: int
    logits_start: int | None
    num_draft: int
    page_copies: tuple[tuple[int, int], ...]


_forward_encoder = msgspec.msgpack.Encoder()
_forward_decoder = msgspec.msgpack.Decoder(list[ForwardItem])


def encode_forward(plan: list[PlanItem]) -> bytes:
    """The forward's part of a step's plan, as rank 0 broadcasts it."""
    names = ForwardItem.__struct_fields__
    return _forward_encoder.encode(
        [ForwardItem(*(getattr(it, name) for name in names)) for it in plan]
    )


def decode_forward(data: bytes) -> list[PlanItem]:
    """The plan items a worker rank runs (each field's type checked as it is read)."""
    return [PlanItem(**msgspec.structs.asdict(f)) for f in _forward_decoder.decode(data)]


@dataclass
class ItemResult:
    next_id: int | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] | None = None
    # logprobs of fill_ids[p] for the prompt positions p this step scored, in order
    prompt_logprobs: list[tuple[float | None, int]] | None = None
    prompt_top_logprobs: list[list[tuple[float, int]]] | None = None
    # a draft item: the picks at the positions after each draft token (next_id above is the first
    # pick)
    draft_results: list["ItemResult"] | None = None
    # a beam's pick: its best (logprob, id) continuations, best first: log_softmax of the raw
    # logits, masked ids left out (SampleRow.beam_candidates of them at most)
    beam_offers: list[tuple[float, int]] | None = None


@dataclass
class StepPlan:
    """One step as planned: each request with its item (decodes first, then drafts, then extends),
    and the mask sources its constrained picks index (live grammar states, kept no longer than the
    step: the runner reads them for the masks and nothing else)."""

    reqs: list[Req] = field(default_factory=list)  # one per item
    items: list[PlanItem] = field(default_factory=list)
    mask_sources: list[Any] = field(default_factory=list)

    def add(self, req: Req, item: PlanItem) -> None:
        self.reqs.append(req)
        self.items.append(item)

    def __len__(self) -> int:
        return len(self.items)


class PlanItemError(RuntimeError):
    """A step failed because of particular items (their indices in the plan): only their requests
    fail; the step's other requests simply run it again."""

    def __init__(self, indices: list[int], message: str, status: int = 500):
        super().__init__(message)
        self.indices = list(indices)
        # 4xx: the requests asked for something impossible (their fault, not the server's)
        self.status = status


class Runner(Protocol):
    """What the scheduler needs from a model runner (model/model_runner.ModelRunner, or a test's
    fake)."""

    tokenizer: Any
    model_path: str
    dtype_name: str
    vocab_size: int
    context_length: int
    eos_token_ids: list[int]
    num_pages: int  # pages of the KV pool
    max_rows: int  # rows of the req->slot table
    kv_bytes_per_token: int | None
    kv_pool_bytes: int | None
    kv_cache_dtype: str | None  # "bfloat16", "int8", ... (None: not a real pool)
    exit_on_rank_loss: bool  # a lost tensor parallel rank ends the process (the scheduler process)

    def run(self, plan: list[PlanItem], mask_sources: list[Any]) -> list[ItemResult]:
        """One forward over the plan and its picks; mask_sources[k] fills the mask of rows with mask
        k. Raises PlanItemError naming the items at fault."""
        ...

    def lora_names(self) -> list[str]:
        """The LoRA adapters loaded (by name)."""
        ...

    def read_lora(self, name: str, path: str) -> Any:
        """The PEFT adapter at path, read and checked, for install_lora (ValueError: why it cannot
        be served). Safe on another thread: it changes nothing."""
        ...

    def install_lora(self, adapter: Any) -> None:
        """Serve an adapter read_lora returned, under its name."""
        ...

    def unload_lora(self, name: str) -> None:
        """Forget adapter name (ValueError: none of that name)."""
        ...

    def make_kv_tier(self, config: ServerConfig) -> TierStore:
        """The second cache tier's page store (tiered_cache.TierStore)."""
        ...

    def close(self) -> None:
        """Stop what the runner started (tensor parallel workers, the tier file)."""
        ...
