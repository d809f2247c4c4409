"""The authenticated channel between a prefill and a decode server: ZeroMQ over TCP with CURVE
(encryption and mutual authentication, libzmq's own, libsodium underneath).

Both servers know one secret (--disaggregation-channel-secret), which nothing else holds (the router
and the clients hold --disaggregation-secret and the API keys, which the configuration refuses as
this one). From it each derives (HKDF, a label per role) the same two CURVE key pairs: the prefill
server's bootstrap port is a CURVE server holding the first, and it admits (ZAP) only clients
holding the second; a decode server is that client and checks the prefill server by the first. A
peer without the secret completes no handshake, so it can neither register pages nor send bytes,
and nothing it sends is read.

Why not Mooncake's TCP transport: it serves reads and writes at any address a peer names, registered
or not, on every interface, to anyone who connects, i.e. the whole process memory of both servers.
Here the page bytes travel inside the authenticated messages and the decode side copies them into
the pages it registered for that room, and nowhere else (decode_agent.py).
"""

from __future__ import annotations

import hashlib
import hmac

import zmq
import zmq.auth.thread
from zmq.utils import z85

CONTROL_MAX_BYTES = 1 << 20  # a decode server's messages are small: no page bytes go that way
ZAP_DOMAIN = b"radixrt-pd"


def _key_pair(secret: str, role: bytes) -> tuple[bytes, bytes]:
    """(public, secret) z85 CURVE keys of role, a pure function of the pair's channel secret
    (--disaggregation-channel-secret, which only the two servers hold): HKDF-SHA256 (RFC 5869)
    with a salt of its own and the role as the label, so no other use of the secret, and no other
    role, yields the same key."""
    secret_key = z85.encode(
        hkdf_sha256(secret.encode(), b"radixrt-pd-channel-v1", b"curve-" + role)
    )
    return zmq.curve_public(secret_key), secret_key


def hkdf_sha256(key: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869's HKDF with SHA-256: extract (HMAC of the key under the salt), then expand."""
    prk = hmac.new(salt, key, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


class _OnlyKey:
    """ZAP: admits exactly one client public key."""

    def __init__(self, public: bytes):
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return hmac.compare_digest(key, self.public)


def bootstrap_socket(
    secret: str, bind: str, peer_queue_messages: int = 1000
) -> tuple[zmq.Context, zmq.Socket, object]:
    """The prefill server's bootstrap port (a ROUTER, CURVE server) bound at bind, in a context of
    its own so the authenticator governs these sockets only. Returns (context, socket,
    authenticator); close all three with close_bootstrap."""
    ctx = zmq.Context()
    auth = zmq.auth.thread.ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(
        ZAP_DOMAIN.decode(), credentials_provider=_OnlyKey(_key_pair(secret, b"d")[0])
    )
    sock = ctx.socket(zmq.ROUTER)
    public, private = _key_pair(secret, b"p")
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = public, private
    # fail closed: with a domain set and enforced, a handshake that gets no ZAP reply (the
    # authenticator's thread gone) is refused; without them libzmq admits any CURVE client
    sock.zap_domain = ZAP_DOMAIN
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, CONTROL_MAX_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    # messages queued to one peer: set before bind, as a bound socket's connections take the
    # options it had when it was bound (set after, it was ZeroMQ's 1,000 chunks of 8 MiB a peer)
    sock.setsockopt(zmq.SNDHWM, peer_queue_messages)
    try:
        sock.bind(bind)
    except zmq.ZMQError as e:
        close_bootstrap(ctx, sock, auth)
        raise RuntimeError(f"cannot bind the bootstrap port {bind}: {e}") from None
    return ctx, sock, auth


def close_bootstrap(ctx: zmq.Context, sock: zmq.Socket, auth: object) -> None:
    sock.close(linger=0)
    auth.stop()
    ctx.term()


def peer_socket(ctx: zmq.Context, secret: str, addr: str, max_bytes: int) -> zmq.Socket:
    """A decode server's DEALER to the prefill server at addr ("host:port"), CURVE client:
    messages over max_bytes (more than this server's whole KV pool) drop the connection."""
    sock = ctx.socket(zmq.DEALER)
    sock.curve_serverkey = _key_pair(secret, b"p")[0]
    sock.curve_publickey, sock.curve_secretkey = _key_pair(secret, b"d")
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{addr}")
    return sock
