"""The gate's key levels (serving/http/auth_levels.py) on the real app (create_app) over a stub tokenizer
manager: each level under each key setup for each caller, POST-only profiling, /get_server_info's
two views, and a crash's generic answer. Truth: the table SGLang's levels imply, written out."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import ProfileOut
from radixrt.runtime.serving.http.auth_levels import ROUTE_LEVELS
from radixrt.runtime.serving.http.http_app import create_app
from radixrt.runtime.serving.http.metrics import ServerMetrics

API, ADMIN = "api-key-1", "admin-key-2"
SESSION = "chat-of-another-tenant"


class StubTM:
    """What the routes under test ask of the tokenizer manager."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.scheduler = StubScheduler(config)
        self.tokenizer = SimpleNamespace(chat_template=None, bos_token=None, eos_token="</s>")

    async def cache_tree(self, max_depth: int, max_nodes: int) -> dict:
        return {"root": {"children": []}}


class StubScheduler:
    """What the routes under test ask of the tokenizer manager's scheduler client."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = ServerMetrics()
        self.states: dict = {}
        self.model_info = {"context_length": 2048, "vocab_size": 100}
        self.dead_reason: str | None = None
        self.profiled: list = []
        self.info_error: Exception | None = None

    async def flush_cache(self) -> bool:
        return True

    async def profile(self, msg) -> ProfileOut:
        self.profiled.append(msg.action)
        return ProfileOut(success=True, message="ok")

    async def health_probe(self) -> bool:
        return True

    async def server_info(self, timeout: float = 30.0) -> dict:
        if self.info_error is not None:
            raise self.info_error
        return {
            "sessions": {SESSION: {"turns": 2}},
            "num_sessions": 1,
            "kv_pages_free": 7,
            "cached_tokens": 5,
            "num_running": 1,
            # the second tier's and the KV transfers' figures move with the cache too
            "hicache_hits": 3,
            "hicache_tokens_loaded": 48,
            "kv_transfer_pages": 9,
            "prompt_tokens_computed": 11,
            "a_figure_added_later": 4,
        }


def client(api_key: str | None, admin_api_key: str | None, **config) -> TestClient:
    tm = StubTM(ServerConfig(api_key=api_key, admin_api_key=admin_api_key, **config))
    app = create_app(tm, "stub-model")
    app.state.stub = tm.scheduler
    return TestClient(app, base_url="http://127.0.0.1:30000", raise_server_exceptions=False)


SETUPS = {
    "no key": (None, None),
    "api": (API, None),
    "api+admin": (API, ADMIN),
    "admin": (None, ADMIN),
}
CALLERS = {"none": None, "api": API, "admin": ADMIN, "wrong": "nope"}
ROUTES = {  # one route per level
    "normal": ("GET", "/get_model_info"),
    "admin_optional": ("POST", "/flush_cache"),
    "admin_optional_metrics": ("GET", "/metrics"),
    "admin_force": ("GET", "/cache_tree"),
}
# status by (level, setup) for the callers none / api / admin / wrong
EXPECTED_OPTIONAL = {
    ("admin_optional", "no key"): (200, 200, 200, 200),
    ("admin_optional", "api"): (401, 200, 401, 401),
    ("admin_optional", "api+admin"): (401, 403, 200, 401),
    ("admin_optional", "admin"): (401, 401, 200, 401),
}
EXPECTED = {
    ("normal", "no key"): (200, 200, 200, 200),
    ("normal", "api"): (401, 200, 401, 401),  # the admin key is not configured: a wrong key
    ("normal", "api+admin"): (401, 200, 200, 401),  # an admin key also opens NORMAL routes
    ("normal", "admin"): (200, 200, 200, 200),
    **EXPECTED_OPTIONAL,
    **{("admin_optional_metrics", k[1]): v for k, v in list(EXPECTED_OPTIONAL.items())},
    ("admin_force", "no key"): (403, 403, 403, 403),  # refused outright without an admin key
    ("admin_force", "api"): (403, 403, 403, 403),
    ("admin_force", "api+admin"): (401, 403, 200, 401),
    ("admin_force", "admin"): (401, 401, 200, 401),
}


def auth(key: str | None) -> dict:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("setup", SETUPS)
def test_each_level_under_each_key_setup(setup):
    c = client(*SETUPS[setup])
    for level, (method, path) in ROUTES.items():
        got = tuple(c.request(method, path, headers=auth(k)).status_code for k in CALLERS.values())
        assert got == EXPECTED[level, setup], (level, path)
    assert c.get("/health").status_code == 200  # open whatever the keys
    assert c.get("/dashboard").status_code == 200


def test_a_keyless_disaggregated_server_serves_no_admin_route():
    """#56.9: a prefill or decode server started without keys left /flush_cache,
    /unload_lora_adapter and /metrics open to whoever reaches it (the gateway and its peer do, over
    the network); its normal routes stay open (the gateway's requests)."""
    pd = {"disaggregation_secret": "b" * 16, "disaggregation_channel_secret": "c" * 16}
    for mode, extra in (("prefill", {}), ("decode", {"disaggregation_prefill_addrs": ("h:1",)})):
        c = client(None, None, disaggregation_mode=mode, **pd, **extra)
        for method, path in (("POST", "/flush_cache"), ("GET", "/metrics")):
            got = c.request(method, path)
            assert got.status_code == 403, (mode, path, got.text)
            assert got.json()["error"]["code"] == "admin_key_not_set"
        assert c.post("/unload_lora_adapter", json={"lora_name": "a"}).status_code == 403
        assert c.get("/get_model_info").status_code == 200
        keyed = client(None, ADMIN, disaggregation_mode=mode, **pd, **extra)
        assert keyed.post("/flush_cache", headers=auth(ADMIN)).status_code == 200


def test_refusals_name_the_missing_key():
    body = client(API, None).get("/cache_tree", headers=auth(API)).json()["error"]
    assert body["code"] == "admin_key_not_set" and "--admin-api-key" in body["message"]
    body = client(API, ADMIN).post("/flush_cache", headers=auth(API)).json()["error"]
    assert body["code"] == "admin_key_required" and "--admin-api-key" in body["message"]
    assert client(API, ADMIN).get("/cache_tree").json()["error"]["code"] == "invalid_api_key"


def test_every_levelled_path_is_a_route():
    routes = {r.path for r in client(None, None).app.routes}
    assert set(ROUTE_LEVELS) <= routes


def test_the_same_key_twice_is_refused():
    with pytest.raises(ValueError, match="admin_api_key"):
        ServerConfig(api_key="same", admin_api_key="same")


def test_profile_routes_are_post_only():
    c = client(None, ADMIN)
    for path in ("/start_profile", "/stop_profile"):
        assert c.get(path, headers=auth(ADMIN)).status_code == 405
        assert c.get(path).status_code == 401  # the key is asked before the method
    assert c.app.state.stub.profiled == []
    assert c.post("/start_profile", headers=auth(ADMIN)).status_code == 200
    assert c.post("/stop_profile", headers=auth(ADMIN)).status_code == 200
    assert c.app.state.stub.profiled == ["start", "stop"]
    # keyless: a web page's request cannot start it either way
    assert client(None, None).post("/start_profile").status_code == 403


def test_server_info_config_and_sessions_only_for_the_admin():
    c = client(API, ADMIN, model_path="/srv/secret/model-dir")
    for key in (API,):
        info = c.get("/get_server_info", headers=auth(key)).json()
        assert "sessions" not in info and SESSION not in str(info)
        assert "/srv/secret" not in str(info) and API not in str(info)
        assert "model_path" not in info and "api_key" not in info
        # what a client works with stays: model, limits, live counts
        assert info["served_model_name"] == "stub-model" and info["context_length"] == 2048
        assert info["max_running_requests"] == 64 and info["num_running"] == 1
        # exact cache figures would tell how much of one's prompt someone else sent: an allowlist,
        # so the second tier's, the transfers' and a figure nobody vetted stay the admin's
        hidden = ("kv_pages_free", "cached_tokens", "hicache_hits", "hicache_tokens_loaded")
        hidden += ("kv_transfer_pages", "prompt_tokens_computed", "a_figure_added_later")
        assert not set(hidden) & set(info), info
    full = c.get("/server_info", headers=auth(ADMIN)).json()
    assert full["sessions"] == {SESSION: {"turns": 2}} and full["cached_tokens"] == 5
    assert full["hicache_hits"] == 3 and full["a_figure_added_later"] == 4
    assert full["model_path"] == "/srv/secret/model-dir"
    assert full["api_key"] == full["admin_api_key"] == "***" and ADMIN not in str(full)
    # no admin key configured: nobody gets the full view
    for c, key in ((client(API, None), API), (client(None, None), None)):
        info = c.get("/get_server_info", headers=auth(key)).json()
        assert "sessions" not in info and info["kv_pages_free"] == 7  # the figures: ADMIN_OPTIONAL


def test_model_info_names_no_path_but_to_the_admin():
    for api, admin in SETUPS.values():
        c = client(api, admin, model_path="/srv/secret/model-dir")
        for key in {api, None}:
            info = c.get("/get_model_info", headers=auth(key)).json()
            if api is not None and key is None:
                assert "error" in info  # the gate's 401
                continue
            assert "/srv/secret" not in str(info), (api, admin, key, info)
            # SGLang's clients pick a chat template by model_path: the served name stands in
            assert info["model_path"] == info["tokenizer_path"] == "stub-model"
        if admin is not None:
            full = c.get("/model_info", headers=auth(admin)).json()
            assert full["model_path"] == full["tokenizer_path"] == "/srv/secret/model-dir"


def test_a_crash_answers_an_error_id_and_logs_the_detail(caplog):
    c = client(None, None)
    c.app.state.stub.info_error = RuntimeError("cannot open /srv/secret/config.json")
    with caplog.at_level(logging.ERROR):
        r = c.get("/get_server_info")
    err = r.json()["error"]
    assert r.status_code == 500 and "/srv/secret" not in r.text and "RuntimeError" not in r.text
    error_id = err["message"].split("error id ")[1].split(";")[0]
    logged = [rec for rec in caplog.records if error_id in rec.getMessage()]
    assert logged and "/srv/secret/config.json" in str(logged[0].exc_info[1])


def test_a_repeated_deciding_header_is_refused():
    """#56.5: the gate read the last Authorization header, client_of and the Responses store the
    first: a valid key and any other value minted a new client identity per request."""
    c = client(API, None)
    for first, second in ((API, "someone-else"), ("someone-else", API), (API, API)):
        r = c.get("/get_server_info", headers=[("Authorization", f"Bearer {first}"),
                                               ("Authorization", f"Bearer {second}")])  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == "authorization", r.text
    r = c.get("/get_model_info", headers=[("Origin", "http://a.example"), ("Origin", "null")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "origin", r.text
    assert c.get("/get_model_info", headers=auth(API)).status_code == 200  # one is served
