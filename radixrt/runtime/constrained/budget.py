"""Budget steering: a constrained request close to the end of its token budget is kept on a path
that can still finish the grammar, so its output is a complete match whenever a complete match fits.

On a token DFA (outlines-core's Index) the shortest way to finish is exact: `dist[s]` is the fewest
tokens from state s to an accepting state (a reverse breadth-first search over the states' successor
sets, computed once per grammar in the compile worker, ~0.7 s per 10M transitions). A pick with
`budget` tokens left (this one included) may take token t only if dist[next(s, t)] <= budget - 1;
starting from dist[s] <= budget that keeps dist <= budget after every pick, so the budget ends on an
accepting state. Steering engages only where it removes something: when some successor of s is
farther than budget - 1 (`max_next[s] > budget - 1`). A token it removes leads where no complete
match fits the budget any more, so output only changes where unsteered output would have been cut
short; requests that finish well inside their budget decode exactly as before. When even dist[s] >
budget nothing is steered (no valid ending fits) and the request ends with finish_reason length,
marked incomplete.

Per state, the tokens and the distance after each are read from the index when steering first
needs that state (~4 ms for a state allowing 49k tokens) and kept in a small LRU per grammar.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

UNREACHABLE = 1 << 30
MAX_CACHED_STATES = 256


def completion_distances(index: Any) -> tuple[dict[int, int], dict[int, int]]:
    """(dist, max_next): the fewest tokens from each state to an accepting one, and the largest dist
    among a state's successors (UNREACHABLE where a successor can never accept). torch-free."""
    initial = index.get_initial_state()
    successors: dict[int, set[int]] = {}
    todo = [initial]
    while todo:
        s = todo.pop()
        if s in successors:
            continue
        nxt = {index.get_next_state(s, t) for t in index.get_allowed_tokens(s) or ()}
        nxt.discard(None)  # the EOS token has no successor state
        successors[s] = nxt
        todo.extend(n for n in nxt if n not in successors)
    predecessors: dict[int, list[int]] = collections.defaultdict(list)
    for s, nxt in successors.items():
        for n in nxt:
            predecessors[n].append(s)
    dist = {s: 0 for s in successors if index.is_final_state(s)}
    frontier = collections.deque(dist)
    while frontier:
        s = frontier.popleft()
        for p in predecessors[s]:
            if p not in dist:
                dist[p] = dist[s] + 1
                frontier.append(p)
    max_next = {
        s: max((dist.get(n, UNREACHABLE) for n in nxt), default=0) for s, nxt in successors.items()
    }
    return dist, max_next


def write_id_bits(words: Any, ids: np.ndarray) -> None:
    """Write a mask row (a CPU int32 tensor of 32-bit words) allowing exactly `ids`."""
    w = words.numpy().view(np.uint32)
    w.fill(0)
    np.bitwise_or.at(w, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))


class Steering:
    """The distances of one compiled grammar and the per-state token tables steering has needed."""

    def __init__(self, index: Any, dist: dict[int, int], max_next: dict[int, int], eos_id: int):
        self.index = index
        self.dist = dist
        self.max_next = max_next
        self.eos_id = eos_id
        self._tables: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray]] = (
            collections.OrderedDict()
        )

    def engages(self, state: int, budget: int) -> bool:
        """At `state` with `budget` picks left (this one included), steering removes some token."""
        d = self.dist.get(state, UNREACHABLE)
        return d <= budget and self.max_next.get(state, 0) > budget - 1

    def allowed_ids(self, state: int, budget: int) -> np.ndarray:
        """The non-EOS tokens of `state` after which a complete match still fits in budget - 1
        picks."""
        ids, after = self._table(state)
        return ids[after <= budget - 1]

    def _table(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        table = self._tables.get(state)
        if table is not None:
            self._tables.move_to_end(state)
            return table
        ids = [t for t in self.index.get_allowed_tokens(state) or () if t != self.eos_id]
        after = [self.dist.get(self.index.get_next_state(state, t), UNREACHABLE) for t in ids]
        table = self._tables[state] = (
            np.asarray(ids, dtype=np.int32),
            np.asarray(after, dtype=np.int64),
        )
        while len(self._tables) > MAX_CACHED_STATES:
            self._tables.popitem(last=False)
        return table


class SteeredMask:
    """The mask source of a pick under steering: only tokens that keep a complete match within the
    budget, and EOS where the grammar accepts."""

    ended = False

    def __init__(
        self,
        steering: Steering,
        state: int,
        budget: int,
        accepting: bool,
        eos_token_ids: list[int],
        num_words: int,
    ):
        self.steering, self.state, self.budget = steering, state, budget
        self.accepting = accepting
        self.eos_token_ids = eos_token_ids
        self.num_words = num_words

    def write_bits(self, words: Any) -> None:
        write_id_bits(words, self.steering.allowed_ids(self.state, self.budget))

    def eos_open(self) -> bool:
        return self.accepting
