"""/start_profile and /stop_profile: torch.profiler around the scheduler process's steps, as
SGLang's routes.

The trace is written on stop (or after num_steps forward steps) as a Chrome trace,
`<dir>/radixrt-<unix time>.trace.json`, only inside the directory the operator set: --profile-dir,
else $SGLANG_TORCH_PROFILER_DIR (SGLang's variable), else profiles/ in radixrt's cache directory
($RADIXRT_CACHE_DIR or ~/.cache/radixrt; made 0700). A request's output_dir must resolve
(os.path.realpath: symlinks, `..`) to that directory or inside it; anything else is a 400 naming
output_dir, checked by the route and again here, where the file is written. Answers name the
trace relative to that directory, never its absolute path.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

logger = logging.getLogger(__name__)


def profile_root(config: Any) -> str:
    """The directory traces go to (resolved)."""
    root = config.profile_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR")
    if not root:
        from radixrt.runtime.model.weights import cache_root

        root = os.path.join(cache_root(), "profiles")
    return os.path.realpath(root)


def check_output_dir(output_dir: object, root: str) -> str:
    """Where a request's trace goes: root itself when output_dir is unset, else output_dir (taken
    relative to root) if it resolves to root or inside it (ValueError naming output_dir
    otherwise)."""
    if output_dir is None or output_dir == "":
        return root
    if not isinstance(output_dir, str) or "\0" in output_dir:
        raise ValueError("output_dir must be a path")
    real = os.path.realpath(os.path.join(root, output_dir))  # a relative one: inside root
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise ValueError("output_dir must be --profile-dir or a directory inside it")
    return real


class StepProfiler:
    def __init__(self, config: Any) -> None:
        self.root = profile_root(config)
        self.prof: Any = None
        self.output_dir = ""
        self.steps_left: int | None = None

    def _shown(self, path: str) -> str:
        """path as an answer names it: relative to --profile-dir."""
        return os.path.join("<profile-dir>", os.path.relpath(path, self.root))

    def start(self, output_dir: str | None, num_steps: int | None) -> tuple[bool, str]:
        if self.prof is not None:
            return False, "the profiler is already running"
        if num_steps is not None and not (isinstance(num_steps, int) and num_steps > 0):
            return False, "num_steps must be a positive integer"
        try:
            output_dir = check_output_dir(output_dir, self.root)
        except ValueError as e:
            return False, str(e)
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.makedirs(output_dir, mode=0o700, exist_ok=True)
        except OSError as e:
            logger.error("profile directory %s cannot be created: %s", output_dir, e)
            return False, f"output_dir {self._shown(output_dir)} cannot be created"
        import torch

        self.prof = torch.profiler.profile(record_shapes=False)
        self.prof.__enter__()
        self.output_dir, self.steps_left = output_dir, num_steps
        return True, f"profiling; the trace goes to {self._shown(output_dir)}"

    def stop(self) -> tuple[bool, str]:
        if self.prof is None:
            return False, "the profiler is not running"
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        path = os.path.join(self.output_dir, f"radixrt-{time.time():.0f}.trace.json")
        prof.export_chrome_trace(path)
        logger.info("profile written to %s", path)
        return True, f"trace written to {self._shown(path)}"

    def after_step(self) -> None:
        """Called after each forward step: ends a num_steps profile by itself."""
        if self.prof is not None and self.steps_left is not None:
            self.steps_left -= 1
            if self.steps_left <= 0:
                self.stop()
