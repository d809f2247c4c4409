"""#56.9: `radixrt serve` reads its keys from their variables, then takes them out of its own
environment, so the processes it starts (grammar compile workers, tensor-parallel workers,
sglang-router) inherit none. Truth: a child process started afterwards, reading its environment."""

from __future__ import annotations

import subprocess
import sys

from radixrt import cli
from radixrt.runtime.config_checks import SECRET_ENVS


def test_serve_takes_the_keys_and_its_children_inherit_none(monkeypatch):
    for env in SECRET_ENVS.values():
        monkeypatch.setenv(env, f"value-of-{env}-long-enough")
    args = cli.build_parser().parse_args(["serve", "--api-key", "from-the-flag-long-enough"])
    cli.take_secret_envs(args)
    assert args.api_key == "from-the-flag-long-enough"  # a flag wins over its variable
    for name, env in SECRET_ENVS.items():
        if name != "api_key":
            assert getattr(args, name) == f"value-of-{env}-long-enough"
    names = list(SECRET_ENVS.values())
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print([n for n in {names!r} if n in os.environ])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "[]"
