"""#57: /metrics counts the drafts verified for finished requests (radixrt:spec_verify_steps,
radixrt:spec_accepted_tokens) from each request's last delta, which carries its totals
(core/outbox.py). Truth: prometheus_client's own text exposition, parsed back."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from radixrt.runtime.serving.http.metrics import ServerMetrics


def sample(metrics: ServerMetrics, name: str) -> float:
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not exposed")


def test_finished_requests_add_their_draft_totals():
    m = ServerMetrics()
    done = {"finished_reason": {"type": "length"}, "prompt_tokens": 5, "completion_tokens": 40}
    m.on_finish({**done, "spec_verify_ct": 9, "spec_accepted_tokens": 30}, 0.5)
    m.on_finish({**done, "spec_verify_ct": 2, "spec_accepted_tokens": 3}, 0.5)
    m.on_finish(done, 0.5)  # a request without drafts counts nothing
    assert sample(m, "radixrt:spec_verify_steps_total") == 11
    assert sample(m, "radixrt:spec_accepted_tokens_total") == 33
    assert sample(m, "radixrt:generation_tokens_total") == 120
