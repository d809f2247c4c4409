"""What a step costs, learnt from the steps the server runs: seconds by the number of tokens fed,
for steps of decodes alone, steps with a prompt chunk (an extend) in them, and steps of decodes
that verify drafts (draft_lengths.py; such a step leaves the whole-step graph).

The fair share of a step across clients (fair_share.py) needs to know what a step of n tokens
costs on this machine, with this model and these kernels: on a GPU, or a CPU whose decode is bound
by reading the weights, 8 rows cost barely more than 2; on a 2-core CPU each row costs, and a step
with any prompt chunk in it costs far more than one of decodes (measured on a 2-core Zen 4, the
default model: 2 decode rows 14 ms, 8 rows 26 ms, a 15-token chunk beside them 60 ms). Measured,
not assumed, so the same rule holds on each machine. Steps are binned by tokens (roughly
geometric bins); a bin's point is the median of its last few steps (a one-off slow step, a graph
compiled on first use, does not move it); between bins the cost is interpolated, past the largest
it grows in proportion to the tokens, and it never falls as the tokens rise.
"""

from __future__ import annotations

import bisect
from collections import deque
from statistics import median

# upper edges of the bins (a step of n tokens falls in the first bin whose edge is >= n)
BIN_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
             1536, 2048, 3072, 4096, 6144, 8192)  # fmt: skip
SAMPLES_PER_BIN = 9


class StepCurve:
    """Seconds by tokens for one kind of step."""

    def __init__(self) -> None:
        self._bins: dict[int, deque[tuple[int, float]]] = {}
        self._points: list[tuple[float, float]] | None = None  # points(), until the next record

    def record(self, tokens: int, seconds: float) -> None:
        """A forward that fed `tokens` tokens took `seconds`."""
        if tokens <= 0 or not seconds > 0:
            return
        edge = BIN_EDGES[min(bisect.bisect_left(BIN_EDGES, tokens), len(BIN_EDGES) - 1)]
        self._bins.setdefault(edge, deque(maxlen=SAMPLES_PER_BIN)).append((tokens, seconds))
        self._points = None

    def points(self) -> list[tuple[float, float]]:
        """(tokens, seconds) per bin measured, by tokens, the seconds made non-decreasing."""
        if self._points is not None:
            return self._points
        out: list[tuple[float, float]] = []
        for edge in sorted(self._bins):
            samples = self._bins[edge]
            x = median(t for t, _ in samples)
            y = median(s for _, s in samples)
            if out:
                y = max(y, out[-1][1])
            out.append((x, y))
        self._points = out
        return out

    def estimate(self, tokens: int) -> float | None:
        """Seconds a step of `tokens` tokens should take; None before any step was measured."""
        pts = self.points()
        if not pts:
            return None
        if tokens <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if tokens <= x1:
                return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        x, y = pts[-1]
        return y * tokens / x


class StepCosts:
    """The curves: decodes alone, steps with a prompt chunk (never cheaper than decodes), and steps
    of decodes that verify drafts (draft_cost: such a step leaves the whole-step graph)."""

    def __init__(self) -> None:
        self.decode, self.extend, self.verify = StepCurve(), StepCurve(), StepCurve()

    def record(
        self, tokens: int, seconds: float, extends: bool = False, verifies: bool = False
    ) -> None:
        curve = self.extend if extends else self.verify if verifies else self.decode
        curve.record(tokens, seconds)

    def estimate(self, tokens: int, extends: bool = False) -> float | None:
        """Seconds a step of `tokens` tokens should take (None: not measured yet)."""
        plain = self.decode.estimate(tokens)
        if not extends:
            return plain
        chunk = self.extend.estimate(tokens)
        return chunk if plain is None or chunk is None else max(chunk, plain)

    def draft_cost(self, tokens: int, verifies: bool) -> float | None:
        """Seconds of a decode step of `tokens` tokens as drafts are costed (draft_lengths.py): one
        that verifies drafts on their own curve (the decode curve until one is measured); past the
        largest count a curve measured, what that one cost, so drafts run and the curve learns."""
        curve = self.verify if verifies and self.verify.points() else self.decode
        points = curve.points()
        if points and tokens > points[-1][0]:
            return points[-1][1]
        return curve.estimate(tokens)

    def info(self) -> dict[str, list[list[float]]]:
        """The curves' points as [tokens, milliseconds] (an admin's figure)."""
        return {
            name: [[round(n), round(t * 1e3, 3)] for n, t in curve.points()]
            for name, curve in (
                ("decode", self.decode),
                ("extend", self.extend),
                ("verify", self.verify),
            )
        }
