"""#56.3: the PD pair's channel keys derive from a secret of their own, never from what the router or
a client holds. Truths: RFC 5869's own test vector and the `cryptography` package's HKDF for the
derivation; the --pd launcher's server configs (captured) for the generated secret."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.disaggregation import channel
from radixrt.runtime.serving.launch import pd_launch


def test_hkdf_is_rfc_5869():
    # RFC 5869, test case 1 (SHA-256)
    ikm, salt = bytes([0x0B] * 22), bytes(range(13))
    info = bytes(range(0xF0, 0xFA))
    okm = channel.hkdf_sha256(ikm, salt, info, 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )
    for length in (16, 32, 64, 100):
        want = HKDF(hashes.SHA256(), length, b"radixrt", b"label").derive(b"k" * 40)
        assert channel.hkdf_sha256(b"k" * 40, b"radixrt", b"label", length) == want


def test_channel_keys_are_labelled_per_role_and_not_the_old_hmac():
    import hmac

    secret = "a-channel-secret-of-enough-length"
    prefill, decode = channel._key_pair(secret, b"p"), channel._key_pair(secret, b"d")
    assert prefill != decode and prefill == channel._key_pair(secret, b"p")
    old = hmac.new(secret.encode(), b"radixrt-pd-p", hashlib.sha256).digest()  # the old derivation
    assert channel.z85.decode(prefill[1]) != old


def test_pd_launch_gives_the_servers_a_random_channel_secret_the_router_never_sees(monkeypatch):
    launched = []

    def fake_serve(config, what, configs, router_flags, each_needed=False):
        launched.append((config, configs))
        return 0

    monkeypatch.setattr(pd_launch, "serve_behind_router", fake_serve)
    key = "the-router-and-client-api-key"
    config = ServerConfig(pd="1p1d", api_key=key)
    pd_launch.launch_pd(config)
    pd_launch.launch_pd(config)
    (front, (prefill, decode)), (_, (again, _)) = launched
    secret = prefill.disaggregation_channel_secret
    assert secret == decode.disaggregation_channel_secret and len(secret) >= 43  # 256 bits
    assert secret != key and secret != prefill.disaggregation_secret
    assert again.disaggregation_channel_secret != secret  # random per launch
    assert front.disaggregation_channel_secret is None  # the router's config holds none
    with pytest.raises(ValueError):  # and a server refuses one equal to the router's
        prefill.replace(disaggregation_channel_secret=key)
