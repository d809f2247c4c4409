"""Who may call which route: SGLang's three auth levels, the one route -> level table, and the
decision the gate (http_app.GateMiddleware) takes on every request.

- NORMAL: the API key when --api-key is set (the admin key works too); open when it is not.
- ADMIN_OPTIONAL: the admin key when --admin-api-key is set; else the API key when that is set;
  else open (a keyless server on loopback stays usable from its own machine), but on a prefill or
  decode server, which the gateway and its peer reach over the network by design: refused (403).
- ADMIN_FORCE: the admin key, and refused (403) when no admin key is set, whatever key is sent:
  these routes read other tenants' data (the cache view) or touch the server's files (LoRA
  load, the profiler's traces), which one shared API key must not unlock.

As SGLang's (python/sglang/srt/utils/auth.py), but an admin key also opens NORMAL routes, and
/metrics is ADMIN_OPTIONAL (SGLang leaves it open for scrapers; its exact hit counts tell a client
how much of its prompt someone else sent: give the scraper the admin key). /health and the
dashboard's static page (cache_routes.PUBLIC_PATHS) take no key. /get_server_info is NORMAL; its
config and session ids are shown only to a request carrying the admin key, and its exact cache
figures as an ADMIN_OPTIONAL route's answer (status_routes.py).

"Pins of others": /unpin names its pin by handle, a 128-bit secret only the pinning client was
given, so a client can only let go of its own pins (NORMAL); /close_session names a session by
its id within the caller's cache_salt (core/sessions.py), the id being also what continues it on
/generate, and the ids are listed to the admin only. What acts on every tenant's pins at once
(/flush_cache) is an admin route.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import Enum
from typing import Any

from radixrt.runtime.serving.http.cache_routes import PUBLIC_PATHS


class AuthLevel(str, Enum):
    NORMAL = "normal"
    ADMIN_OPTIONAL = "admin_optional"
    ADMIN_FORCE = "admin_force"


# every route not named here is NORMAL; docs/security.md lists this table
ROUTE_LEVELS: dict[str, AuthLevel] = {
    "/cache_tree": AuthLevel.ADMIN_FORCE,  # decodes every tenant's cached prompts
    "/load_lora_adapter": AuthLevel.ADMIN_FORCE,  # reads a path on the server
    "/start_profile": AuthLevel.ADMIN_FORCE,  # writes trace files
    "/stop_profile": AuthLevel.ADMIN_FORCE,
    "/flush_cache": AuthLevel.ADMIN_OPTIONAL,  # drops every tenant's cache and pins
    "/unload_lora_adapter": AuthLevel.ADMIN_OPTIONAL,  # takes an adapter away from everyone
    "/metrics": AuthLevel.ADMIN_OPTIONAL,  # exact cache hit counts: an oracle of others' prompts
}
OPEN_PATHS = frozenset({"/health"}) | PUBLIC_PATHS
ADMIN_STATE = "radixrt_admin"  # the request scope's state entry: it carried the admin key


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    code: str


def level_of(path: str) -> AuthLevel:
    return ROUTE_LEVELS.get(path, AuthLevel.NORMAL)


class KeyCheck:
    """The configured keys, compared in constant time against the Authorization header."""

    def __init__(self, api_key: str | None, admin_api_key: str | None, exposed: bool = False):
        """exposed: a server others reach by design (a prefill or decode server: the gateway and
        the peer server do), whose ADMIN_OPTIONAL routes a keyless setup must not leave open."""
        self.api = None if api_key is None else f"Bearer {api_key}".encode()
        self.admin = None if admin_api_key is None else f"Bearer {admin_api_key}".encode()
        self.closed_optional = exposed and self.api is None and self.admin is None

    def holds(self, authorization: bytes) -> tuple[bool, bool]:
        """(carries the API key, carries the admin key); both compared whatever the first says."""
        api = self.api is not None and hmac.compare_digest(authorization, self.api)
        admin = self.admin is not None and hmac.compare_digest(authorization, self.admin)
        return api, admin

    def refusal(self, path: str, authorization: bytes) -> Refusal | None:
        """None: the request may go on; else why not (401: no valid key, 403: not enough)."""
        if path in OPEN_PATHS:
            return None
        level = level_of(path)
        api, admin = self.holds(authorization)
        if level is AuthLevel.ADMIN_OPTIONAL and self.closed_optional:
            return Refusal(
                403,
                f"{path} is an admin route and this disaggregated server has no key: start it "
                "with --admin-api-key (or --api-key) to use it",
                "admin_key_not_set",
            )
        if level is AuthLevel.ADMIN_FORCE and self.admin is None:
            return Refusal(
                403,
                f"{path} is an admin route and this server has no admin key: start it with "
                "--admin-api-key to use it",
                "admin_key_not_set",
            )
        needs_admin = level is not AuthLevel.NORMAL and self.admin is not None
        if needs_admin:
            if admin:
                return None
            if api:
                return Refusal(
                    403, f"{path} needs the admin key (--admin-api-key)", "admin_key_required"
                )
        elif self.api is None or api or admin:
            return None  # NORMAL, or ADMIN_OPTIONAL without an admin key
        return Refusal(
            401, "invalid or missing API key (Authorization: Bearer <key>)", "invalid_api_key"
        )


def mark_admin(scope: dict, admin: bool) -> None:
    """Tell the route whether this request carried the admin key (a fresh dict: the scope's state
    may be a copy shared with the app's lifespan state)."""
    scope["state"] = {**scope.get("state", {}), ADMIN_STATE: admin}


def is_admin(request: Any) -> bool:
    """Did this request carry the admin key? False without the gate (closed by default)."""
    return bool(request.scope.get("state", {}).get(ADMIN_STATE))
