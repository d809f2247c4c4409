"""Counters the scheduler keeps (its live figures and integrity check: scheduler_admin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.core.req import Req


@dataclass
class SchedulerStats:
    num_forwards: int = 0
    num_preemptions: int = 0
    num_admitted: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    num_draft_tokens: int = 0  # jump-forward draft tokens fed for verification
    num_draft_accepted: int = 0  # of those, the ones the model's pick agreed with
    num_step_failures: int = (
        0  # forwards that raised (their culprit requests failed, the rest went on)
    )
    prompt_tokens_computed: int = 0  # prompt positions computed here (not cached, not received)
    # prefill-decode disaggregation: pages and bytes this server sent (prefill) or received (decode)
    kv_transfers: int = 0
    kv_transfer_pages: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfer_failures: int = 0
    integrity_error: str | None = None  # the last integrity walk's finding (None: it held)
    integrity_checked_at: float = 0.0  # time.time() of that walk (0: never)

    def on_admit(self, prompt_len: int, cached_len: int) -> None:
        self.num_admitted += 1
        self.prompt_tokens += prompt_len
        self.cached_tokens += cached_len

    def on_computed(self, prompt_len: int, start: int, end: int) -> None:
        """A forward computed positions start..end of a request."""
        self.prompt_tokens_computed += max(0, min(end, prompt_len) - start)

    def on_transfer(self, num_pages: int, num_bytes: int, seconds: float) -> None:
        """One request's KV moved (sent: as the prefill server; else received)."""
        self.kv_transfers += 1
        self.kv_transfer_pages += num_pages
        self.kv_transfer_bytes += num_bytes
        self.kv_transfer_seconds += seconds

    def transfer_info(self) -> dict:
        return {
            "kv_transfers": self.kv_transfers,
            "kv_transfer_pages": self.kv_transfer_pages,
            "kv_transfer_bytes": self.kv_transfer_bytes,
            "kv_transfer_seconds": round(self.kv_transfer_seconds, 6),
            "kv_transfer_failures": self.kv_transfer_failures,
            "prompt_tokens_computed": self.prompt_tokens_computed,
        }

    def on_finish(self, req: Req) -> None:
        self.num_finished += 1
        self.generated_tokens += len(req.output_ids)
        if req.finished_reason is not None and req.finished_reason.is_abort:
            self.num_aborted += 1
