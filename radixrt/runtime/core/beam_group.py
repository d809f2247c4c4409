"""One beam search request inside the scheduler: its live beams as requests sharing pages.

The request the client sent (the root) is admitted and prefilled like any other; its pick offers
the search its best continuations instead of a sampled token. From then on every live beam is a
running Req of its own (rid `root/beamN`), decoded in the same step as its siblings; when the group
has all their offers, the search (beam_search.py) picks the next beams and the group maps them onto
requests:

- a beam continued once keeps its request and appends the token;
- a beam continued k > 1 times first puts its whole pages into the radix tree (ReqMemory.share);
  each extra child borrows them and copies only the partial last page (ReqMemory.fork_beam), and
  its grammar state is forked from the parent's;
- a beam not continued is dropped: the pages only it held go back to the allocator.

So beams share the pages of their common history and split only where they differ. A group that
must give its memory back (preemption) starts again from its prompt (the search is deterministic,
the prompt is usually still cached); an abort or a failure ends every beam.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.core.beam_search import BeamSearch, Continuation, Hypothesis
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.req import GrammarState, Req
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.messages import TokenOut


@dataclass
class BeamMoves:
    """What one advance did to the scheduler's running list."""

    added: list[Req] = field(default_factory=list)  # forked beams, now running
    removed: list[Req] = field(default_factory=list)  # pruned beams, their memory dropped
    out_of_memory: bool = False  # a fork found no pages: the group must start again


class BeamGroup:
    def __init__(self, root: Req, stop_ids: frozenset[int]):
        self.root = root
        self.stop_ids = stop_ids
        self.width = root.sampling.beam_width
        self.num_return = root.sampling.n
        self.search = self._new_search()
        self.beams: list[Req] = [root]  # live beams, best first after each advance
        self.offers: dict[int, list[tuple[float, int]]] = {}  # id(beam) -> its offers this step
        self.peak_pages = 0  # most distinct pages the live beams held at once
        self.pristine_grammar: GrammarState | None = (
            None  # the root's grammar before any token (for a restart)
        )
        self._num_forks = 0

    def _new_search(self) -> BeamSearch:
        sp = self.root.sampling
        return BeamSearch(
            self.width,
            max_new_tokens=sp.max_new_tokens,
            stop_ids=self.stop_ids,
            length_penalty=sp.length_penalty,
            early_stopping=sp.early_stopping,
        )

    @property
    def num_candidates(self) -> int:
        """Continuations each beam offers per step (SampleRow.beam_candidates)."""
        return self.search.num_candidates

    def offer(self, beam: Req, offers: list[tuple[float, int]]) -> None:
        """A beam's best (logprob, token) continuations from this step's forward."""
        self.offers[id(beam)] = offers

    def ready(self) -> bool:
        """Every live beam has offered: the group can advance."""
        return bool(self.beams) and all(id(b) in self.offers for b in self.beams)

    def advance(self, memory: ReqMemory) -> BeamMoves:
        """One search step mapped onto the beams' requests and pages."""
        self.peak_pages = max(self.peak_pages, len({p for b in self.beams for p in b.kv.page_ids}))
        if self.pristine_grammar is None and self.root.grammar is not None:
            self.pristine_grammar = self.root.grammar.fork([])
        offers = [self.offers[id(b)] for b in self.beams]
        self.offers = {}
        chosen = self.search.step(
            [b.output_ids for b in self.beams], [b.beam_logprob for b in self.beams], offers
        )
        moves = BeamMoves()
        kept = {c.parent for c in chosen}
        for b, beam in enumerate(self.beams):  # pruned beams first: their rows serve the forks
            if b not in kept:
                memory.drop(beam)
                moves.removed.append(beam)
        taken: dict[Continuation, Req] = {}
        for b, beam in enumerate(self.beams):
            mine = [c for c in chosen if c.parent == b]
            if not mine:
                continue
            if len(mine) > 1:
                memory.share(beam)
            for c in mine[1:]:  # forks first: they copy the parent's grammar before its own token
                child = self._child(beam)
                if not memory.fork_beam(child, beam):
                    moves.out_of_memory = True
                    break
                moves.added.append(child)
                taken[c] = child
            if moves.out_of_memory:
                break
            taken[mine[0]] = beam
        if moves.out_of_memory:  # everything still holding memory, for restart's drop
            self.beams = [b for i, b in enumerate(self.beams) if i in kept] + moves.added
            return moves
        for c, beam in taken.items():
            self._extend(beam, c)
        self.beams = [taken[c] for c in chosen]
        return moves

    def _child(self, parent: Req) -> Req:
        """A new request continuing parent's beam (no memory yet: fork_beam gives it some)."""
        self._num_forks += 1
        root = self.root
        child = Req(
            f"{root.rid}/beam{self._num_forks}",
            root.origin_input_ids,
            root.sampling,
            root.options,
            arrival_time=root.arrival_time,  # preemption takes a group's beams together
        )
        child.output_ids = list(parent.output_ids)
        child.beam, child.beam_logprob = self, parent.beam_logprob
        child.admitted, child.cached_tokens = True, root.cached_tokens
        child.lora_slot, child.key_offset = root.lora_slot, root.key_offset
        if parent.grammar is not None:
            child.grammar = parent.grammar.fork(parent.output_ids)
        return child

    @staticmethod
    def _extend(beam: Req, c: Continuation) -> None:
        beam.output_ids.append(c.token)
        beam.beam_logprob = c.total
        if beam.grammar is not None:
            beam.grammar.accept(c.token)

    def restart(self) -> None:
        """Start again from the prompt (every beam's memory was dropped): the root waits to be
        admitted again."""
        root = self.root
        self.search = self._new_search()
        self.beams, self.offers = [root], {}
        root.output_ids, root.beam_logprob = [], 0.0
        if self.pristine_grammar is not None:
            root.grammar = self.pristine_grammar.fork([])

    def result(self) -> TokenOut:
        """The finished search as the root's one TokenOut: the returned beams, best first."""
        hyps = self.search.results(self.num_return)
        beams = [self._beam_out(h) for h in hyps]
        best = hyps[0].output_ids if hyps else ()
        reason = beams[0]["finish_reason"] if beams else FinishReason.stop(None).to_dict()
        return TokenOut(
            rid=self.root.rid,
            new_ids=[],
            finished_reason=reason,
            prompt_tokens=len(self.root.origin_input_ids),
            completion_tokens=len(best),
            cached_tokens=self.root.cached_tokens,
            beams=beams,
        )

    def _beam_out(self, h: Hypothesis) -> dict[str, Any]:
        last = h.output_ids[-1]
        if last in self.stop_ids:
            reason = FinishReason.stop(last)
        else:
            reason = FinishReason.length_limit(len(h.output_ids))
        return {
            "output_ids": list(h.output_ids),
            "cumulative_logprob": h.cumulative_logprob,
            "score": h.score,
            "finish_reason": reason.to_dict(),
            "peak_pages": self.peak_pages,
        }
