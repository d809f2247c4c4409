"""Prometheus metrics of the server (GET /metrics), kept in the main process.

Latencies are measured where the client sees them (the tokenizer manager receiving text);
the pool / cache figures are copied from scheduler.admin.server_info() at scrape time. A private
registry keeps several servers in one process (tests) from clashing.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the route)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)

# the second cache tier's figures (--enable-hierarchical-cache), copied from server_info like the
# pool's
HICACHE_GAUGES = {
    "hicache_hits": "Matches that loaded KV back from the second tier (a counter's value)",
    "hicache_tokens_loaded": "Tokens of KV copied back from the second tier (a counter's value)",
    "hicache_tokens_written": "Tokens of KV written to the second tier (a counter's value)",
    "hicache_bytes_loaded": "Bytes copied back from the second tier (a counter's value)",
    "hicache_bytes_written": "Bytes written to the second tier (a counter's value)",
    "hicache_load_seconds": "Seconds spent loading from the second tier (a counter's value)",
    "hicache_load_latency_p99_s": "p99 of one load from the second tier, seconds (recent loads)",
    "hicache_pages_used": "Second tier pages holding KV",
    "hicache_pages_total": "Second tier size in pages",
    "hicache_checksum_failures": "Loads that found a corrupt tier page (recomputed instead)",
}


class ServerMetrics:
    def __init__(self, model_name: str = ""):
        self.registry = CollectorRegistry()
        self._add_counts(self.registry)
        self._add_gauges(self.registry)

    def _add_counts(self, r: CollectorRegistry) -> None:
        """What happened since start: counters, and latency histograms measured in this process."""
        self.http_requests = Counter(
            "radixrt:http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=r,
        )
        self.requests = Counter(
            "radixrt:requests",
            "Generation requests (one per sequence) finished, by reason",
            ["finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "radixrt:prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter(
            "radixrt:generation_tokens", "Generated tokens", registry=r
        )
        self.cached_tokens = Counter(
            "radixrt:cached_tokens", "Prompt tokens served from the radix cache", registry=r
        )
        self.spec_verify_steps = Counter(
            "radixrt:spec_verify_steps",
            "Steps that verified a draft of a finished request (jump-forward, radix tree, prompt "
            "lookup)",
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "radixrt:spec_accepted_tokens",
            "Draft tokens of finished requests the model agreed with",
            registry=r,
        )
        self.ttft = Histogram(
            "radixrt:time_to_first_token_seconds",
            "Arrival to first token (streamed requests)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "radixrt:inter_token_latency_seconds",
            "Time between tokens of a streamed request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "radixrt:e2e_request_latency_seconds",
            "Arrival to finish",
            buckets=_E2E_BUCKETS,
            registry=r,
        )

    def _add_gauges(self, r: CollectorRegistry) -> None:
        """The state now: requests in flight here, and the scheduler's figures (copied from
        server_info at scrape time, `update_from_server_info`)."""
        self.running = Gauge("radixrt:num_running_reqs", "Requests decoding", registry=r)
        self.waiting = Gauge(
            "radixrt:num_waiting_reqs", "Requests queued in the scheduler", registry=r
        )
        self.inflight = Gauge(
            "radixrt:num_inflight_reqs", "Requests the HTTP server is waiting on", registry=r
        )
        self.cache_hit_rate = Gauge(
            "radixrt:cache_hit_rate", "Cached / all prompt tokens since start", registry=r
        )
        self.pages_total = Gauge("radixrt:kv_pages_total", "KV pool size in pages", registry=r)
        self.pages_free = Gauge("radixrt:kv_pages_free", "Free KV pages", registry=r)
        self.pages_evictable = Gauge(
            "radixrt:kv_pages_evictable", "Cached KV pages that may be evicted", registry=r
        )
        self.token_usage = Gauge(
            "radixrt:token_usage", "Fraction of the KV pool held by running requests", registry=r
        )
        self.preemptions = Gauge(
            "radixrt:num_preemptions",
            "Requests preempted since start (a counter's value)",
            registry=r,
        )
        self.hicache = {
            key: Gauge(f"radixrt:{key}", text, registry=r) for key, text in HICACHE_GAUGES.items()
        }

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_next_tokens(self, seconds: float, num_tokens: int) -> None:
        # A delta of k tokens (jump-forward, a late poll) counts as k tokens spaced evenly.
        for _ in range(num_tokens):
            self.itl.observe(seconds / num_tokens)

    def on_finish(self, out: dict[str, Any], seconds: float) -> None:
        reason = (out.get("finished_reason") or {}).get("type", "unknown")
        self.requests.labels(finish_reason=reason).inc()
        self.prompt_tokens.inc(out.get("prompt_tokens", 0))
        self.generation_tokens.inc(out.get("completion_tokens", 0))
        self.cached_tokens.inc(out.get("cached_tokens", 0))
        self.spec_verify_steps.inc(out.get("spec_verify_ct", 0))
        self.spec_accepted_tokens.inc(out.get("spec_accepted_tokens", 0))
        self.e2e.observe(seconds)

    def on_http(self, route: str, status: int) -> None:
        self.http_requests.labels(route=route, status=str(status)).inc()

    def update_from_server_info(self, info: dict[str, Any]) -> None:
        total = info.get("kv_pages_total", 0)
        free = info.get("kv_pages_free", 0)
        evictable = info.get("kv_pages_evictable", 0)
        self.running.set(info.get("num_running", 0))
        self.waiting.set(info.get("num_waiting", 0))
        self.cache_hit_rate.set(info.get("cache_hit_rate", 0.0))
        self.pages_total.set(total)
        self.pages_free.set(free)
        self.pages_evictable.set(evictable)
        self.token_usage.set(1.0 - (free + evictable) / total if total else 0.0)
        self.preemptions.set(info.get("num_preemptions", 0))
        for key, gauge in self.hicache.items():
            gauge.set(info.get(key) or 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
