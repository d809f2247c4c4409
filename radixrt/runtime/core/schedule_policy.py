"""Which waiting requests to admit next: cache-aware order, in-batch prefix sharing, budgets.

Plain data only (ints and lists): tested on the CPU without a model.
"""

from __future__ import annotations

from radixrt.runtime.core.req import Req
from radixrt.runtime.core.token_prefix import common_prefix_len

# Past this many waiting requests, matching every one against the tree each step costs more
# than the ordering gains: fall back to first-come-first-served.
LPM_MAX_QUEUE = 128
# A waiting request is held back one step when it shares at least this many *uncached*
# tokens with a request being prefilled now: once that prefill is in the tree it matches
# instead of computing the same prefix again.
SHARE_MIN_TOKENS = 32
# Fraction of each running request's remaining max_new_tokens kept free when admitting more.
# Too low and decode preempts often; too high and the pool sits idle.
NEW_TOKEN_RESERVE_RATIO = 0.3
# Jump-forward draft tokens fed in one step, over all requests: each one costs a logits row and a
# sampled pick, so a wide batch of drafts must not turn one step into a long prefill.
MAX_DRAFT_TOKENS_PER_STEP = 256
# Tokens copied back from the second cache tier that cost the step's prefill budget one token: a
# copy is far cheaper than computing them (benchmarks/bench_hicache.py measures both), but not free.
TIER_LOAD_TOKENS_PER_BUDGET_TOKEN = 16


def order_waiting(
    waiting: list[Req],
    match_len: dict[int, int],
    policy: str,
    running_rows: dict[str | None, int] | None = None,
    priority_sign: int = 0,
) -> list[Req]:
    """Longest cached prefix first ('lpm'), else arrival order, then fair across clients: a
    request's turn is its client's running rows (running_rows: client -> rows) plus the client's
    requests before it in that order, and turns go lowest first (stable), so a client with 500
    queued requests does not hold every row for the length of its queue (#56.5) while one client
    alone keeps the policy's order. priority_sign (1: higher priority values first, -1: lower
    first, 0: --enable-priority-scheduling off) puts priority before the turn. match_len: id(req)
    -> cached tokens."""
    if policy == "lpm" and len(waiting) <= LPM_MAX_QUEUE:
        # stable sort: ties keep arrival order, and a program's requests stay adjacent by program_id
        ordered = sorted(
            waiting,
            key=lambda r: (-match_len.get(id(r), 0), r.options.program_id or "", r.arrival_time),
        )
    else:
        ordered = list(waiting)
    if not priority_sign and len({r.options.client for r in ordered}) <= 1:
        return ordered  # one client waiting: its turns rise along the order, which stays
    turns = dict(running_rows or {})
    keys: dict[int, tuple[int, int]] = {}
    for r in ordered:
        client = r.options.client
        keys[id(r)] = (-priority_sign * (r.options.priority or 0), turns.get(client, 0))
        turns[client] = turns.get(client, 0) + (r.sampling.beam_width if r.sampling.is_beam else 1)
    return sorted(ordered, key=lambda r: keys[id(r)])


def shares_inflight_prefix(ids: list[int], matched_len: int, inflight: list[list[int]]) -> bool:
    """True when `ids` shares >= SHARE_MIN_TOKENS uncached tokens with a prefill in flight."""
    for other in inflight:
        if common_prefix_len(ids, other) - matched_len >= SHARE_MIN_TOKENS:
            return True
    return False


def decode_reserve_tokens(running: list[Req]) -> int:
    """Tokens to keep free for the running requests' future decode steps."""
    total = 0
    for r in running:
        remaining = r.sampling.max_new_tokens - len(r.output_ids)
        if remaining > 0:
            total += remaining
    return int(total * NEW_TOKEN_RESERVE_RATIO)
