"""/start_profile and /stop_profile: torch.profiler around the scheduler process's steps, as
SGLang's routes.

The trace is written on stop (or after num_steps forward steps) as a Chrome trace,
`<output_dir>/radixrt-<unix time>.trace.json`; output_dir defaults to $SGLANG_TORCH_PROFILER_DIR
(SGLang's variable), else the system's temporary directory.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any

logger = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self) -> None:
        self.prof: Any = None
        self.output_dir = ""
        self.steps_left: int | None = None

    def start(self, output_dir: str | None, num_steps: int | None) -> tuple[bool, str]:
        if self.prof is not None:
            return False, "the profiler is already running"
        if num_steps is not None and not (isinstance(num_steps, int) and num_steps > 0):
            return False, "num_steps must be a positive integer"
        output_dir = (
            output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or tempfile.gettempdir()
        )
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            return False, f"output_dir {output_dir!r} cannot be created: {e}"
        import torch

        self.prof = torch.profiler.profile(record_shapes=False)
        self.prof.__enter__()
        self.output_dir, self.steps_left = output_dir, num_steps
        return True, f"profiling; the trace goes to {output_dir}"

    def stop(self) -> tuple[bool, str]:
        if self.prof is None:
            return False, "the profiler is not running"
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        path = os.path.join(self.output_dir, f"radixrt-{time.time():.0f}.trace.json")
        prof.export_chrome_trace(path)
        logger.info("profile written to %s", path)
        return True, f"trace written to {path}"

    def after_step(self) -> None:
        """Called after each forward step: ends a num_steps profile by itself."""
        if self.prof is not None and self.steps_left is not None:
            self.steps_left -= 1
            if self.steps_left <= 0:
                self.stop()
