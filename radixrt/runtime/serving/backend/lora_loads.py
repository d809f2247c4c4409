"""POST /load_lora_adapter and /unload_lora_adapter in the scheduler process, without stalling its
loop: reading an adapter (its files, the tensors' conversion) runs on a worker thread while the
loop keeps stepping; the loop installs the finished adapter, so the registry and the scheduler's
state stay the loop's alone.

The main process's scheduler client (serving/http/scheduler_client.py) pairs LoraAdapterOut answers
with its requests by order, so the requests queue and are answered in arrival order: the head runs
(a load's checks of its name and of --max-loaded-loras on the loop, before any file is opened; then
its read on the worker), the rest wait behind it. A refusal's text never carries a reason from the
file system (model/lora_paths.py).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from radixrt.runtime.messages import LoraAdapterOut, LoraAdapterReq
from radixrt.runtime.model.lora_paths import LoraRefused

logger = logging.getLogger(__name__)

# tests: every read takes this much longer (a slow disk); only whoever starts the process sets it
READ_DELAY_ENV = "RADIXRT_LORA_READ_DELAY_S"
FAILED = "the LoRA adapter request failed (the server log says why)"


class LoraLoads:
    def __init__(self, scheduler: Any, answer: Callable[[LoraAdapterOut], None]):
        self.scheduler = scheduler
        self.answer = answer
        self.queue: collections.deque[LoraAdapterReq] = collections.deque()
        self.reading: Future | None = None  # the head's read, on the worker
        self._worker: ThreadPoolExecutor | None = None  # started by the first load
        self.read_delay_s = float(os.environ.get(READ_DELAY_ENV) or 0)

    @property
    def busy(self) -> bool:
        """A request is waiting for its answer (the loop then polls more often)."""
        return bool(self.queue)

    def submit(self, msg: LoraAdapterReq) -> None:
        self.queue.append(msg)
        self.poll()

    def poll(self) -> None:
        """Answer every request that can be answered now, in order; start the next read."""
        while self.queue:
            out = self._advance(self.queue[0])
            if out is None:
                return  # the head's adapter is still being read
            self.queue.popleft()
            self.answer(out)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)

    def _advance(self, msg: LoraAdapterReq) -> LoraAdapterOut | None:
        """The head's answer, or None while its read runs."""
        s = self.scheduler
        try:
            if msg.action != "load":
                s.admin.unload_lora(msg.lora_name)
                return self._done(f"unloaded {msg.lora_name}")
            if self.reading is None:
                s.admin.check_lora_load(msg.lora_name)
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(1, thread_name_prefix="lora-read")
                self.reading = self._worker.submit(self._read, msg.lora_name, msg.lora_path)
            if not self.reading.done():
                return None
            reading, self.reading = self.reading, None
            s.admin.install_lora(reading.result())
            return self._done(f"loaded {msg.lora_name}")
        except ValueError as e:  # a refusal: its text is the answer
            self.reading = None
            param = "lora_path" if isinstance(e, LoraRefused) else "lora_name"
            return self._refused(str(e), param)
        except Exception:  # a bug: logged, answered, and the loop goes on
            self.reading = None
            logger.exception("LoRA adapter request %s %r failed", msg.action, msg.lora_name)
            return self._refused(FAILED, "lora_name")

    def _read(self, name: str, path: str | None) -> Any:
        """On the worker: the adapter, read and checked by the runner (it changes no state)."""
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        try:
            return self.scheduler.admin.read_lora(name, path)
        except ValueError:
            raise
        except BaseException as e:  # a native reader's panic (pyo3) is no Exception
            logger.exception("reading LoRA adapter %r failed", name)
            raise LoraRefused(f"{type(e).__name__}: {e}") from None

    def _done(self, message: str) -> LoraAdapterOut:
        return LoraAdapterOut(
            success=True, message=message, adapters=self.scheduler.runner.lora_names()
        )

    def _refused(self, message: str, param: str) -> LoraAdapterOut:
        return LoraAdapterOut(
            success=False,
            message=message,
            adapters=self.scheduler.runner.lora_names(),
            param=param,
        )
