"""`radixrt serve --pd 1p1d`: a local disaggregated deployment to try prefill-decode disaggregation
on one machine: a prefill server (--disaggregation-mode prefill, its bootstrap port
--disaggregation-bootstrap-port), a decode server (--disaggregation-mode decode), each a plain
`radixrt serve` on a free local port with half the CPU threads, and sglang-router's PD mode on
--host/--port in front:

    python -m sglang_router.launch_router --pd-disaggregation \\
        --prefill http://127.0.0.1:P 8998 --decode http://127.0.0.1:D

Across machines, start the two servers there with --disaggregation-mode and run that router
command yourself. Either server's or the router's death stops the rest (exit 1); SIGTERM / Ctrl-C
stop everything.
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.serving.dp_launch import serve_behind_router


def launch_pd(config: Any) -> int:
    """A prefill and a decode server (half the cores each) behind sglang-router's PD mode."""
    servers = [config.replace(pd=None, disaggregation_mode=m) for m in ("prefill", "decode")]
    bootstrap = str(config.disaggregation_bootstrap_port)
    return serve_behind_router(
        config,
        "--pd",
        servers,
        lambda urls: ["--pd-disaggregation", "--prefill", urls[0], bootstrap, "--decode", urls[1]],
        each_needed=True,
    )
