"""The one error a request's checks raise: what was wrong, and the field it names."""

from __future__ import annotations


class RequestError(ValueError):
    """A request that can never run as given; `param` names the offending field (an HTTP route
    answers it with a 400 naming that field, the Engine raises it, the scheduler's intake ends that
    request alone with it)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code
