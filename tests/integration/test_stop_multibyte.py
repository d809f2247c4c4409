"""Stop strings of multi-byte characters (CJK, emoji) end the request where the text shows them, on the
Engine and over HTTP. A regex forces the model to write the stop string (each emoji is several byte-level
tokens), so the test does not depend on what the model would say. Before the one incremental matcher
(runtime/request/incremental_detokenizer.py), the scheduler looked back `1 + len(stop) + 4` tokens with len in
characters, and a stop string spanning more tokens than that never matched on the Engine."""

from __future__ import annotations

import httpx
import pytest
from conftest_server import DEFAULT_SERVER_ARGS

from radixrt import Engine

CASES = [
    ("x" + "🙂" * 6 + "y" * 6, "🙂" * 6),  # 6 emoji: 24 bytes, far more tokens than characters
    ("ab語語語cd", "語語語"),
    ("héllo wörld ünïcode", "wörld"),
]


def check(text: str, reason: dict, forced: str, stop: str) -> None:
    assert reason == {"type": "stop", "matched": stop}, reason
    assert text == forced[: forced.index(stop)], (text, forced)


@pytest.mark.parametrize("forced,stop", CASES)
def test_engine_stops_at_a_multibyte_stop_string(forced, stop, tokenizer):
    assert len(tokenizer.encode(stop, add_special_tokens=False)) >= 3
    engine = Engine(dtype="float32", max_total_tokens=2048)
    try:
        import re

        params = {
            "max_new_tokens": 64,
            "temperature": 0,
            "regex": re.escape(forced),
            "stop": [stop],
        }
        out = engine.generate("Say something:", params)
        check(out["text"], out["meta_info"]["finish_reason"], forced, stop)
        chunks = list(engine.generate("Say something:", params, stream=True))
        assert "".join(c["text"] for c in chunks) == out["text"]
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_http_stops_at_a_multibyte_stop_string(shared_servers):
    import re

    srv = shared_servers.get(DEFAULT_SERVER_ARGS)
    for forced, stop in CASES:
        body = {
            "text": "Say something:",
            "sampling_params": {
                "max_new_tokens": 64,
                "temperature": 0,
                "regex": re.escape(forced),
                "stop": [stop],
            },
        }
        r = httpx.post(srv.url + "/generate", json=body, timeout=120).json()
        check(r["text"], r["meta_info"]["finish_reason"], forced, stop)
        # the server stopped generating there (the raw tokens end at most a token past the stop string),
        # it did not only trim the text
        raw = decode(r["output_ids"])
        assert len(raw) <= forced.index(stop) + len(stop) + 2, (raw, forced)


def decode(ids: list[int]) -> str:
    from radixrt.runtime.model.weights import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(None)).decode(ids)
