"""What keeps a web page from driving the server through the user's browser.

A page on any site can make the browser send requests to http://127.0.0.1:30000: simple POSTs
(text/plain, no preflight) and, after DNS rebinding, requests whose Host names the attacker's
domain. So: a POST body must be declared JSON (a browser cannot send application/json cross-site
without a CORS preflight, which this server never grants); an Origin other than the server's own
is refused unless allowed; the Host header must name the bind address unless allowed. On a
wildcard bind (0.0.0.0) that is any IP literal, the loopback names and this machine's own host
names, never any other DNS name: a rebinding attack has the browser send the attacker's name.
"""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
ANY_ADDRESS = {"0.0.0.0", "::", ""}


def _split(csv: str | None) -> set[str] | None:
    return None if csv is None else {x.strip().lower() for x in csv.split(",") if x.strip()}


def host_name(host_header: str) -> str:
    """'example.com:30000' -> 'example.com'; '[::1]:30000' -> '[::1]'; 'localhost.' -> 'localhost'
    (the same name, fully qualified)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).rstrip(".")


def is_ip_literal(name: str) -> bool:
    """An address, not a DNS name: a page reached by it has that address as its origin, so no
    rebinding is involved."""
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
    except ValueError:
        return False
    return True


def own_host_names() -> set[str]:
    """This machine's own names (its hostname and fully qualified name): an attacker cannot point
    them elsewhere for this machine's own clients."""
    names = {socket.gethostname(), socket.getfqdn()}
    return {n.lower().rstrip(".") for n in names if n}


class BrowserGuard:
    def __init__(
        self, bind_host: str, port: int, allowed_hosts: str | None, allowed_origins: str | None
    ):
        hosts = _split(allowed_hosts)
        self.any_ip = False  # any IP literal is accepted (a wildcard bind's default)
        if hosts is None:
            bind = bind_host.lower()
            if bind in ANY_ADDRESS:
                hosts = LOOPBACK_NAMES | own_host_names()
                self.any_ip = True
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
        name = host_name(host_header)
        return name in self.hosts or (self.any_ip and is_ip_literal(name))

    def origin_ok(self, origin: str | None, host_header: str | None = None) -> bool:
        """No Origin (not a browser, or a same-origin GET), an allowed one, or same-origin: the
        Origin names exactly the host:port the request was sent to (its Host header), which is
        itself allowed. Host rules that accept many names (a 0.0.0.0 bind, --allowed-hosts '*')
        therefore never let a foreign Origin through."""
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
