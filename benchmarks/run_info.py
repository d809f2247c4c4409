"""What a benchmark's raw results record about where they were measured: the commit and the machine."""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess


def git_commit() -> str:
    here = pathlib.Path(__file__).parent
    run = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=here)  # noqa: E731
    commit = run("rev-parse", "--short", "HEAD").stdout.strip()
    # figures from uncommitted code must not pass for the commit's own
    return commit + ("-dirty" if commit and run("diff", "--quiet", "HEAD", "--").returncode else "")


def machine() -> dict:
    cpu = platform.processor()  # often empty on Linux: /proc/cpuinfo has the model name
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "cpu": cpu or platform.machine(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # the machine may be shared: the load when the run started says how quiet it was
        "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
