"""`python -m radixrt.runtime.serving.router_main <sglang-router flags>`: sglang-router's own
launcher, its --api-key taken from $RADIXRT_ROUTER_API_KEY instead of the command line, which every
local user can read (/proc/<pid>/cmdline; a process's environment is its owner's alone).
dp_launch.start_router starts the router so when the server has an --api-key.

What sglang-router (0.3.2) does with --api-key, tried against a stub worker on loopback
(tests/integration/test_router_auth.py): a client without `Authorization: Bearer <key>` gets a 401
on /generate, the OpenAI routes, /flush_cache and /workers; the router sends the key to the workers
(and with no --api-key it sends /flush_cache to them with no key at all); /health, /v1/models,
/get_model_info (passed through with the client's own header) and its own /get_server_info answer
without the key. It knows no admin key: admin routes go to a server directly.
"""

from __future__ import annotations

import importlib
import os
import sys

ROUTER_KEY_ENV = "RADIXRT_ROUTER_API_KEY"


def main() -> None:
    launch_router = importlib.import_module("sglang_router.launch_router")
    key = os.environ.pop(ROUTER_KEY_ENV, None)
    # sys.argv is this process's copy: the kernel's record of the command line keeps the original
    sys.argv = [sys.argv[0], *sys.argv[1:], *(["--api-key", key] if key else [])]
    launch_router.main()


if __name__ == "__main__":
    main()
