"""What keeps a web page from driving the server through the user's browser.

A page on any site can make the browser send requests to http://127.0.0.1:30000: simple POSTs
(text/plain, no preflight) and, after DNS rebinding, requests whose Host names the attacker's
domain. So: a POST body must be declared JSON (a browser cannot send application/json cross-site
without a CORS preflight, which this server never grants); an Origin other than the server's own
is refused unless allowed; the Host header must name the bind address unless allowed.
"""

from __future__ import annotations

LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
ANY_ADDRESS = {"0.0.0.0", "::", ""}


def _split(csv: str | None) -> set[str] | None:
    return None if csv is None else {x.strip().lower() for x in csv.split(",") if x.strip()}


def host_name(host_header: str) -> str:
    """'example.com:30000' -> 'example.com'; '[::1]:30000' -> '[::1]'."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class BrowserGuard:
    def __init__(
        self, bind_host: str, port: int, allowed_hosts: str | None, allowed_origins: str | None
    ):
        hosts = _split(allowed_hosts)
        if hosts is None:
            bind = bind_host.lower()
            if bind in ANY_ADDRESS:
                hosts = {"*"}
            elif bind in LOOPBACK_NAMES or bind.startswith("127."):
                hosts = LOOPBACK_NAMES | {bind}
            else:
                hosts = {bind}
        self.hosts = hosts
        self.origins = _split(allowed_origins) or set()
        self.port = port

    def host_ok(self, host_header: str | None) -> bool:
        # no Host: not a browser (HTTP/1.1 browsers always send it)
        if host_header is None or "*" in self.hosts:
            return True
        return host_name(host_header) in self.hosts

    def origin_ok(self, origin: str | None, host_header: str | None = None) -> bool:
        """No Origin (not a browser, or a same-origin GET), an allowed one, or same-origin: the
        Origin names exactly the host:port the request was sent to (its Host header), which is
        itself allowed. A wildcard Host rule (0.0.0.0 binds) therefore never lets a foreign Origin
        through."""
        if origin is None:
            return True
        origin = origin.strip().lower()
        if "*" in self.origins or origin in self.origins:
            return True
        scheme, _, rest = origin.partition("://")
        return (
            scheme in ("http", "https")
            and host_header is not None
            and rest == host_header.strip().lower()
            and self.host_ok(host_header)
        )

    @staticmethod
    def content_type_ok(method: str, content_type: str | None, has_body: bool = True) -> bool:
        """A POST with a body must declare it JSON (application/json, any parameters). A bodiless
        POST (SGLang clients call /flush_cache so) carries nothing to smuggle; a browser's
        cross-site one has an Origin and is refused for that."""
        if method != "POST" or not has_body:
            return True
        return (
            content_type is not None
            and content_type.split(";")[0].strip().lower() == "application/json"
        )
