"""The scheduler's KV role: where a request's KV comes from and goes (vLLM's KV connector shape).

The Scheduler holds one role and calls it at five points of a request's path: intake (may this
request run here), admission (which waiting requests get memory, and whether they compute),
the sampled token (does it stay here), finish (does a peer wait for it) and poll (what happened to
the KV in flight). Each hook takes what it needs as arguments and answers with a value the
scheduler applies: a role never moves a request between the queues or changes its status itself
(admission, which a role's admit hook calls with the queues, does that as for any request).

- UnifiedRole (--disaggregation-mode null): every hook is a no-op; requests compute their prompt.
- PrefillRole and DecodeRole (kv_roles_pd.py, with make_role): the two halves of prefill-decode
  disaggregation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.plan import ItemResult, PlanItem
from radixrt.runtime.core.req import Req
from radixrt.runtime.request.options import Bootstrap

if TYPE_CHECKING:
    from radixrt.runtime.core.admission import Admission, ExtendItem


@dataclass(frozen=True)
class TransferDone:
    """The KV of a request the role held (sending or waiting for its KV) stopped moving: it then
    runs again, to resume decoding from `first` (decode: the prefill server's first token), to end
    with `reason`, or to fail with `error` (a 500)."""

    req: Req
    first: ItemResult | None = None
    reason: FinishReason | None = None
    error: str | None = None


class UnifiedRole:
    """A server that computes every request's prompt and decodes it itself."""

    name = "null"
    computes_prompts = True  # admission may fork a sample from a running request's prompt
    # every row it holds is a running request's (fair_share may take one back for another client)
    rows_all_running = True

    def intake(self, req: Req, running: list[Req], waiting: list[Req]) -> None:
        """ValueError when req cannot run on this server (running, waiting: the queues)."""

    def refused(self, bootstrap: Bootstrap | None, error: Exception) -> None:
        """A request was refused at intake (its peer, if any, is told now)."""

    def admit(
        self,
        waiting: list[Req],
        running: list[Req],
        budget: int,
        inflight: list[list[int]],
        admission: Admission,
        extend_item: ExtendItem,
    ) -> list[tuple[Req, PlanItem]]:
        """Admission's extend items for this step (the admitted requests leave waiting)."""
        return admission.admit(waiting, running, budget, inflight, extend_item)

    def on_sampled(self, req: Req, reason: FinishReason | None, res: ItemResult) -> bool:
        """req sampled a token; True when the role takes it over (it then stops running here)."""
        return False

    def on_finish(self, req: Req, reason: FinishReason) -> None:
        """req ends (a peer waiting for its KV stops waiting)."""

    def abort(self, rid: str) -> None:
        """A client's abort of a request the role holds: it ends once its KV stops moving."""

    def poll(self) -> list[TransferDone]:
        return []

    def held(self) -> list[Req]:
        """Requests holding pages and a table row without running (their KV in flight)."""
        return []

    def close(self) -> None: ...
