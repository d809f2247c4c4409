"""`radixrt serve --pd 1p1d`: the launcher starts a prefill server, a decode server and the gateway's (smg) PD
mode, answers like a unified server and stops cleanly.

Truth: a unified server's greedy output in float32 (started and stopped first, so that no more than two
servers are up at once). Every server serves the session's tiny random Llama (tiny_model_dir): the
launcher's plumbing is the point, and equal outputs of two of our own configurations hold for any
model; the launcher hands --model-path on to both of its servers.
"""

import httpx
import psutil
import pytest
from conftest_server import ServerProcess, free_port

pytestmark = pytest.mark.integration
pytest.importorskip("smg", reason="the PD gateway is smg's (pip install smg)")

COMMON = ["--page-size", "4", "--max-total-tokens", "8192", "--log-level", "warning"]
KEY = "the-launchers-router-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {
    "text": "The opposite of hot is",
    "sampling_params": {"max_new_tokens": 12, "temperature": 0},
}


def test_pd_1p1d_starts_all_three_and_answers_like_a_unified_server(
    tmp_path_factory, tiny_model_dir
):
    common = ["--model-path", tiny_model_dir, *COMMON]
    unified = ServerProcess(common, tmp_path_factory.mktemp("unified"))
    try:
        want = httpx.post(unified.url + "/generate", json=BODY, timeout=120).json()["output_ids"]
    finally:
        unified.stop()
    port = free_port()
    srv = ServerProcess(
        [*common, "--pd", "1p1d", "--disaggregation-bootstrap-port", str(port)],
        tmp_path_factory.mktemp("pd"),
        env={"RADIXRT_API_KEY": KEY},  # kept out of the launcher's argv, as out of its servers'
    )
    try:
        assert httpx.post(srv.url + "/generate", json=BODY, timeout=120).status_code == 401
        got = httpx.post(srv.url + "/generate", json=BODY, headers=AUTH, timeout=120)
        assert got.status_code == 200 and got.json()["output_ids"] == want
        assert len(srv.alive_pids()) >= 3  # the launcher, its two servers (and theirs), the router
        for pid in srv.alive_pids():  # the key is in no command line, the router's included
            cmdline = " ".join(psutil.Process(pid).cmdline())
            assert KEY not in cmdline, cmdline
    finally:
        code = srv.stop()
    assert code == 0
    assert not srv.alive_pids()
