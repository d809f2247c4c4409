"""Why a request ended, inside core: a typed value, turned into SGLang's plain dict (it crosses
processes) only where a TokenOut message is built (outbox.py, the scheduler's intake refusal).

The dicts, exactly: {"type": "stop", "matched": id or str or None}, {"type": "length", "length": n}
(plus "incomplete": True when a grammar had no complete match within the budget), {"type": "abort",
"message": str}; a request that asked for a pin adds "pinned" and "pin_handle".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # stop: the stop token id or string (None: the grammar ended)
    length: int = 0  # length: output tokens at the limit
    incomplete: bool = False  # length: the grammar had not reached a final state
    message: str = ""  # abort: why
    pin_asked: bool = False  # the request asked for a pin: the dict says whether it got one
    pin_handle: str | None = None

    @staticmethod
    def stop(matched: int | str | None) -> FinishReason:
        return FinishReason("stop", matched=matched)

    @staticmethod
    def length_limit(length: int, incomplete: bool = False) -> FinishReason:
        return FinishReason("length", length=length, incomplete=incomplete)

    @staticmethod
    def abort(message: str) -> FinishReason:
        return FinishReason("abort", message=message)

    @property
    def is_abort(self) -> bool:
        return self.type == "abort"

    def with_pin(self, handle: str | None) -> FinishReason:
        """The reason once the finished request's pin was asked for (handle None: refused)."""
        return dataclasses.replace(self, pin_asked=True, pin_handle=handle)

    def to_dict(self) -> dict[str, Any]:
        """SGLang's finish reason, for the TokenOut message."""
        out: dict[str, Any] = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        elif self.type == "length":
            out["length"] = self.length
            if self.incomplete:
                out["incomplete"] = True
        else:
            out["message"] = self.message
        if self.pin_asked:
            out["pinned"] = self.pin_handle is not None
            out["pin_handle"] = self.pin_handle
        return out
