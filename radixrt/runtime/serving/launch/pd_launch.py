"""`radixrt serve --pd 1p1d`: a local disaggregated deployment to try prefill-decode disaggregation
on one machine: a prefill server (--disaggregation-mode prefill, its bootstrap port
--disaggregation-bootstrap-port), a decode server (--disaggregation-mode decode, taking KV from that
prefill server only), each a plain `radixrt serve` on a free local port with half the CPU threads,
and the gateway's PD mode on --host/--port in front (--router-backend: smg by default, or
sglang-router; the same flags):

    python -m smg.launch_router --pd-disaggregation --api-key KEY \\
        --prefill http://127.0.0.1:P 8998 --decode http://127.0.0.1:D

The pair's bootstrap secret is --api-key: the gateway presents its key to the servers, and they
take bootstrap fields only with it (docs/security.md). The channel between the two servers is keyed
by a random secret generated per launch, handed to them in their environment and never to the
router. Across machines, start the two servers there with --disaggregation-mode,
--disaggregation-secret, --disaggregation-channel-secret (and on the decode server
--disaggregation-prefill-addrs) and run that router command yourself. Either server's or the
router's death stops the rest (exit 1); SIGTERM / Ctrl-C stop everything.
"""

from __future__ import annotations

import secrets
from typing import Any

from radixrt.runtime.serving.launch.dp_launch import serve_behind_router


def launch_pd(config: Any) -> int:
    """A prefill and a decode server (half the cores each) behind the gateway's PD mode."""
    port = config.disaggregation_bootstrap_port
    # the router presents --api-key to the servers (bootstrap fields); the channel between the two
    # servers is keyed by a secret of its own, random per launch, which the router never gets
    channel = secrets.token_urlsafe(32)  # 256 bits
    pair = {
        "pd": None,
        "disaggregation_secret": config.api_key,
        "disaggregation_channel_secret": channel,
    }
    servers = [
        config.replace(**pair, disaggregation_mode="prefill", host="127.0.0.1"),
        config.replace(
            **pair,
            disaggregation_mode="decode",
            host="127.0.0.1",
            disaggregation_prefill_addrs=(f"127.0.0.1:{port}",),
        ),
    ]
    return serve_behind_router(
        config,
        "--pd",
        servers,
        lambda urls: ["--pd-disaggregation", "--prefill", urls[0], str(port), "--decode", urls[1]],
        each_needed=True,
    )
