"""Jump-forward drafts in the scheduler: how much of a request's draft is fed this step, and which
of its tokens are kept once the model has picked a token at every draft position.

A draft is text the grammar forces, tokenized (constrained/draft.py). It is fed after the
request's last token; the draft is kept up to the first position where the model's pick differs,
plus that pick, so output is exactly token-by-token decoding's.
"""

from __future__ import annotations

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.plan import ItemResult, PlanItem
from radixrt.runtime.core.prompt_lookup import PromptLookup
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_finish import apply_sampled_token
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats
from radixrt.runtime.core.tree_drafts import tree_draft


def next_draft(
    req: Req, config: ServerConfig, tree: RadixCache | None = None
) -> tuple[list[int], list[int]]:
    """(draft ids, grammar states after each) to verify next step: the text the grammar forces, else
    when --speculative-algorithm ngram what the radix tree holds after the request's tokens
    (tree_drafts.py) or a prompt-lookup guess, the longer. output_ids + draft + one pick stay
    within max_new_tokens."""
    room = req.sampling.max_new_tokens - len(req.output_ids) - 1
    if req.grammar is not None:
        return req.grammar.draft(room)
    if config.speculative_algorithm == "ngram" and room > 0:
        if req.lookup is None:
            req.lookup = PromptLookup(config.speculative_num_draft_tokens)
        from_tree = None if tree is None else (lambda limit: tree_draft(tree, req, limit))
        return req.lookup.propose(req.fill_ids, room, from_tree), []
    return [], []


def fit_draft(req: Req, memory: ReqMemory, budget: int) -> int:
    """Cut req's draft to what this step can verify; returns the draft tokens taken from the budget.

    A draft takes only free memory left once every request has room for its next token:
    verifying drafts never preempts a request nor evicts the cache; without room, or past the
    step's draft budget, the request decodes one token."""
    if not req.draft_ids:
        return 0
    num = min(len(req.draft_ids), budget)
    req.draft_ids, req.draft_states = req.draft_ids[:num], req.draft_states[:num]
    if not num or not memory.grow(req, req.seq_len + num, evict=False):
        req.draft_ids, req.draft_states = [], []
    return len(req.draft_ids)


def take_draft(
    req: Req,
    item: PlanItem,
    res: ItemResult,
    eos_ids: set[int],
    memory: ReqMemory,
    stats: SchedulerStats,
) -> FinishReason | None:
    """Apply the picks of a draft item: the draft up to the first pick that differs, and that pick.
    Returns the finish reason, if one of the applied tokens finished the request."""
    draft = item.new_ids[len(item.new_ids) - item.num_draft :]
    picks = [res] + (res.draft_results or [])
    # one pick per position, but none after a draft that ends the grammar
    assert len(draft) <= len(picks) <= len(draft) + 1, (len(picks), len(draft))
    reason = None
    agrees = False
    accepted = 0
    for j, pick in enumerate(picks):
        # the last token and the draft tokens taken so far were fed
        memory.computed(req, req.seq_len)
        agrees = j < len(draft) and pick.next_id == draft[j]
        accepted += agrees
        reason = apply_sampled_token(req, pick, eos_ids)
        if reason is not None or not agrees:
            break
    stats.num_draft_accepted += accepted
    req.spec_verify_ct += 1
    req.spec_accepted += accepted
    req.spec_missed += not agrees and j < len(draft)  # it ended on a draft token picked otherwise
    if req.lookup is not None and req.grammar is None:
        req.lookup.record(len(draft), accepted)
    assert reason is not None or not agrees or len(picks) == len(draft) + 1, (
        "a draft ended the grammar, not the request"
    )
    if reason is None:
        memory.trim(req)
    return reason
