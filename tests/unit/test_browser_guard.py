"""BrowserGuard: the rules that keep a web page from driving the server through a browser."""

import socket

import pytest

from radixrt.runtime.serving.http.browser_guard import BrowserGuard, host_name


@pytest.mark.parametrize(
    "header,name",
    [
        ("example.com:30000", "example.com"),
        ("LOCALHOST", "localhost"),
        ("[::1]:30000", "[::1]"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
    ],
)
def test_host_name(header, name):
    assert host_name(header) == name


def test_loopback_bind_accepts_loopback_names_only():
    g = BrowserGuard("127.0.0.1", 30000, None, None)
    for ok in ("127.0.0.1:30000", "localhost:30000", "[::1]:30000", "localhost", None):
        assert g.host_ok(ok), ok
    for bad in ("evil.example:30000", "attacker.test", "10.0.0.5:30000", "127.0.0.1.nip.io:30000"):
        assert not g.host_ok(bad), bad  # DNS rebinding: the browser sends the attacker's name


def test_wildcard_bind_accepts_addresses_and_own_names_not_any_name(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "box")
    monkeypatch.setattr(socket, "getfqdn", lambda: "box.lab.internal")
    for bind in ("0.0.0.0", "::"):
        g = BrowserGuard(bind, 30000, None, None)
        for ok in (
            "10.0.0.5:30000",
            "192.168.1.20",
            "[fe80::1]:30000",
            "[2001:db8::7]",
            "127.0.0.1:30000",
            "localhost:30000",
            "localhost.:30000",
            "box:30000",
            "BOX.lab.internal",
            None,
        ):
            assert g.host_ok(ok), (bind, ok)
        # DNS rebinding: the browser sends the attacker's name, which resolved to this machine
        for bad in (
            "evil.example:30000",
            "10.0.0.5.nip.io:30000",
            "box.evil.example",
            "lab.internal",
            "attacker",
        ):
            assert not g.host_ok(bad), (bind, bad)
    # other names: --allowed-hosts
    named = BrowserGuard("0.0.0.0", 30000, "api.internal", None)
    assert named.host_ok("api.internal:30000") and not named.host_ok("10.0.0.5:30000")
    assert BrowserGuard("0.0.0.0", 30000, "*", None).host_ok("anything.example")


def test_explicit_hosts_and_wildcards():
    g = BrowserGuard("127.0.0.1", 1, "api.internal, other.internal", None)
    assert (
        g.host_ok("api.internal:1") and g.host_ok("OTHER.internal") and not g.host_ok("localhost")
    )
    assert BrowserGuard("127.0.0.1", 1, "*", None).host_ok("x.example")
    assert BrowserGuard("10.1.2.3", 1, None, None).host_ok("10.1.2.3:1")
    assert not BrowserGuard("10.1.2.3", 1, None, None).host_ok("localhost:1")


def test_origins():
    g = BrowserGuard("127.0.0.1", 30000, None, None)
    assert g.origin_ok(None)  # not a browser, or a same-origin GET
    assert g.origin_ok("http://127.0.0.1:30000", "127.0.0.1:30000")  # its own pages
    assert g.origin_ok("http://localhost:30000", "localhost:30000")
    for bad in (
        "https://evil.example",
        "http://localhost:8080",
        "null",
        "http://evil.example:30000",
        "file://",
    ):
        assert not g.origin_ok(bad, "127.0.0.1:30000"), bad
    # same-origin means the same host:port
    assert not g.origin_ok("http://127.0.0.1:30000", "localhost:30000")
    # a wildcard Host rule (0.0.0.0) must not let a foreign Origin on the right port through
    anywhere = BrowserGuard("0.0.0.0", 30000, None, None)
    assert not anywhere.origin_ok("http://evil.example:30000", "10.0.0.5:30000")
    assert anywhere.origin_ok("http://10.0.0.5:30000", "10.0.0.5:30000")
    allowed = BrowserGuard("127.0.0.1", 30000, None, "https://app.example")
    assert allowed.origin_ok("https://app.example") and not allowed.origin_ok(
        "https://other.example"
    )
    assert BrowserGuard("127.0.0.1", 30000, None, "*").origin_ok("https://any.example")


@pytest.mark.parametrize(
    "ctype,ok",
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("Application/JSON", True),
        ("text/plain", False),
        (None, False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data", False),
        ("application/jsonp", False),
    ],
)
def test_post_bodies_must_be_json(ctype, ok):
    assert BrowserGuard.content_type_ok("POST", ctype) is ok
    assert BrowserGuard.content_type_ok("GET", ctype)  # GETs carry no body
    # nor does a bare POST /flush_cache
    assert BrowserGuard.content_type_ok("POST", ctype, has_body=False)
