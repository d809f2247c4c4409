"""#56.9: the PD bootstrap check compares the Authorization header's bytes with the secret's UTF-8,
as the API keys are compared. A secret outside Latin-1 used to be encoded with "replace", so
`Bearer ????` (and any other run of '?' of its length) passed for it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.datastructures import Headers

from radixrt.runtime.serving.http.pd_auth import check_bootstrap_auth
from radixrt.runtime.serving.http.protocol import APIError

FIELDS = ("10.0.0.2", 8998, 1234)


def config(secret: str):
    return SimpleNamespace(disaggregation_mode="prefill", disaggregation_secret=secret)


def header(value: bytes) -> Headers:
    """Headers as an ASGI server hands them over: raw bytes, read back as latin-1 by Starlette."""
    return Headers(raw=[(b"authorization", value)])


@pytest.mark.parametrize(
    "secret", ["пароль-для-пары-серверов", "秘密の鍵は十六文字以上あります", "x" * 20 + "é"]
)
def test_a_non_latin1_secret_matches_only_its_own_bytes(secret):
    cfg = config(secret)
    check_bootstrap_auth(cfg, header(f"Bearer {secret}".encode()), FIELDS)  # its UTF-8 passes
    for forged in (
        f"Bearer {secret}".encode("latin-1", "replace"),  # the old expected value
        b"Bearer " + b"?" * len(secret),
        b"Bearer ",
        b"",
    ):
        with pytest.raises(APIError) as e:
            check_bootstrap_auth(cfg, header(forged), FIELDS)
        assert e.value.status == 403


def test_plain_secret_and_a_header_that_is_not_latin1():
    cfg = config("an-ascii-secret-of-some-length")
    check_bootstrap_auth(cfg, header(b"Bearer an-ascii-secret-of-some-length"), FIELDS)
    with pytest.raises(APIError):
        check_bootstrap_auth(cfg, {"authorization": "Bearer \u0101"}, FIELDS)  # not from HTTP
    check_bootstrap_auth(cfg, header(b""), (None, None, None))  # no bootstrap fields: no check
