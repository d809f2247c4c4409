"""`python -m radixrt.runtime.serving.launch.router_main <backend> <router flags>`: the gateway's
own launcher (smg's `smg.launch_router`, or sglang-router's `sglang_router.launch_router`: the same
flags), its --api-key taken from $RADIXRT_ROUTER_API_KEY instead of the command line, which every
local user can read (/proc/<pid>/cmdline; a process's environment is its owner's alone).
dp_launch.start_router starts the gateway so when the server has an --api-key.

What both do with --api-key, tried against a stub worker on loopback
(tests/integration/test_router_auth.py): a client without `Authorization: Bearer <key>` gets a 401
on /generate and the OpenAI routes; the gateway sends the key to the workers. It knows no admin
key: admin routes go to a server directly.

What reaches a worker (the same test, both backends): smg (1.13) passes a body's fields through on
/generate, /v1/completions and /v1/chat/completions. sglang-router (0.3.2) rebuilds /generate and
/v1/chat/completions bodies from its own types and drops what they lack: `cache_salt` and
`session_id` on /generate, and those with the bootstrap fields on chat (DROPPED_BY_SGLANG_ROUTER).
"""

from __future__ import annotations

import importlib
import os
import sys

ROUTER_KEY_ENV = "RADIXRT_ROUTER_API_KEY"
# --router-backend -> (the package to find, its launcher module)
ROUTER_BACKENDS = {
    "smg": ("smg", "smg.launch_router"),
    "sglang-router": ("sglang_router", "sglang_router.launch_router"),
}
# the isolating fields sglang-router 0.3.2 drops, by route (a tenant's salt and session would be
# shared behind it: serve warns at start, docs/security.md says so)
DROPPED_BY_SGLANG_ROUTER = {
    "/generate": ("cache_salt", "session_id"),
    "/v1/chat/completions": (
        "cache_salt",
        "session_id",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
    ),
}


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else ""
    if backend not in ROUTER_BACKENDS:
        raise SystemExit(f"router_main: the first argument is one of {sorted(ROUTER_BACKENDS)}")
    launch_router = importlib.import_module(ROUTER_BACKENDS[backend][1])
    key = os.environ.pop(ROUTER_KEY_ENV, None)
    # sys.argv is this process's copy: the kernel's record of the command line keeps the original
    sys.argv = [sys.argv[0], *sys.argv[2:], *(["--api-key", key] if key else [])]
    launch_router.main()


if __name__ == "__main__":
    main()
