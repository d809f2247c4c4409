"""Program: what all states of one run share (id, backend, defaults, pins, executors).

A fork's shared prefix is pinned in the runtime's radix cache (when the backend can
pin) until its branches join; `finish()` releases whatever a program still holds, so
an error or a forgotten join cannot leak a pin.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from radixrt.frontend import ir


class Program:
    """What all states of one run share: its id, its backend, pinned prefixes, executors."""

    def __init__(
        self,
        backend: Any,
        defaults: ir.GenParams,
        stream: bool,
        chat_template: Any = None,
        session_id: str | None = None,
    ):
        self.backend = backend
        self.session_id = session_id  # every gen of the run is a turn of this runtime session
        self.defaults = defaults
        self.stream = stream
        self.program_id = uuid.uuid4().hex
        self.chat_template = chat_template or backend.get_chat_template()
        self.lock = threading.Lock()
        self.pins: dict[Any, None] = {}
        self.executors: list[Any] = []  # StreamExecutors, forks included

    def pin(self, text: str) -> Any:
        """Keep `text`'s KV in the radix cache until unpin; plain caching if unsupported."""
        if getattr(self.backend, "supports_pin", False):
            try:
                handle = self.backend.pin_prefix(text, program_id=self.program_id)
            except (ConnectionError, PermissionError):
                raise
            except Exception:  # a runtime may refuse a pin (e.g. it would hold too much memory)
                handle = None
            if handle is not None:
                with self.lock:
                    self.pins[handle] = None
                return handle
        self.backend.cache_prefix(text, program_id=self.program_id)
        return None

    def unpin(self, handle: Any) -> None:
        with self.lock:
            if handle is None or handle not in self.pins:
                return
            del self.pins[handle]
        try:
            self.backend.unpin(handle)
        except Exception:  # the server may be gone; a pin also expires on its side
            pass

    def finish(self) -> None:
        """Wait for every state (also unjoined forks), stop their workers, drop pins."""
        for exe in list(self.executors):
            exe.sync()
            exe.end()
        for handle in list(self.pins):
            self.unpin(handle)
