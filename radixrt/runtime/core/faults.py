"""Fault injection, for the isolation tests: raise inside a chosen stage of the scheduler for a
chosen request, as a bug in that stage would.

Off unless the environment names faults:
RADIXRT_FAULT_INJECTION="stage:token_id[,stage:token_id...]". A request whose prompt contains
token_id raises InjectedFault in that stage. Stages:
  intake   while the scheduler takes the request in
  grammar  while its compiled grammar is collected
  plan     while its decode item is planned (drafts, sampling rows)
  forward  in the forward pass of any step that carries it (not attributable to one request)
  sample   while its token is picked (attributable: PlanItemError for its item)
  apply    while its sampled token is applied (stop strings, grammar, finish rules)
Requests cannot switch it on: only whoever starts the process can.
"""

from __future__ import annotations

import os

from radixrt.runtime.core.plan import PlanItemError

ENV_VAR = "RADIXRT_FAULT_INJECTION"
STAGES = ("intake", "grammar", "plan", "forward", "sample", "apply")


class InjectedFault(RuntimeError):
    pass


class FaultInjector:
    def __init__(self, spec: str | None = None):
        spec = os.environ.get(ENV_VAR, "") if spec is None else spec
        self.markers: dict[str, set[int]] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            stage, _, token = part.partition(":")
            if stage not in STAGES or not token.isdigit():
                raise ValueError(
                    f"{ENV_VAR}: {part!r} is not stage:token_id with a stage in {STAGES}"
                )
            self.markers.setdefault(stage, set()).add(int(token))

    def _hits(self, stage: str, prompt_ids: list[int]) -> bool:
        marks = self.markers.get(stage)
        return bool(marks) and not marks.isdisjoint(prompt_ids)

    @property
    def enabled(self) -> bool:
        return bool(self.markers)

    def check(self, stage: str, prompt_ids: list[int]) -> None:
        if self._hits(stage, prompt_ids):
            raise InjectedFault(f"injected fault in stage {stage!r}")

    def check_plan(self, prompts: list[list[int]]) -> None:
        """After the forward: the 'forward' stage fails the step, the 'sample' stage one item."""
        if any(self._hits("forward", p) for p in prompts):
            raise InjectedFault("injected fault in stage 'forward'")
        bad = [i for i, p in enumerate(prompts) if self._hits("sample", p)]
        if bad:
            raise PlanItemError(bad, "injected fault in stage 'sample'")
