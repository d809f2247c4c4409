"""#35: stopping `radixrt serve` the way a terminal does it (Ctrl-C, or SIGTERM, sent to the whole process group,
so every child gets it too) ends it with exit code 0 and no traceback from any process: the main process,
scheduler, detokenizer, the grammar compile workers (each has compiled a grammar first), and under --dp-size
the replicas and the gateway (smg). Each process logs one line as it stops. The servers serve the session's
tiny random Llama (tiny_model_dir): stopping is the point, not what the model says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
from conftest_server import free_port

from radixrt.runtime.processes import wait_until_healthy
from radixrt.runtime.serving.launch.dp_launch import router_available, wait_until_routing

SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def serve_then_stop(tmp_path, sig: int, extra: list[str]) -> tuple[int, str]:
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "radixrt.cli",
                "serve",
                "--port",
                str(port),
                "--grammar-compile-workers",
                "2",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)},
            start_new_session=True,
        )  # its own process group, as a terminal's job
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(
                url, proc, 600, poll_s=0.5, log_tail=lambda: log.read_text(errors="replace")[-4000:]
            )
            if "--dp-size" in extra:
                wait_until_routing(url, {}, proc, 120)
            for params in (
                {"json_schema": SCHEMA},
                {"regex": "[0-9]+"},
                {"ebnf": 'root ::= "x" [0-9]'},
            ):
                res = httpx.post(
                    url + "/generate",
                    json={"text": "hi", "sampling_params": {"max_new_tokens": 4, **params}},
                    timeout=300,
                )
                assert res.status_code == 200, res.text
            group = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            os.killpg(proc.pid, sig)  # every process of the group at once
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert not [
        p
        for p in group
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    return code, log.read_text(errors="replace")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_group_signal_stops_cleanly(tmp_path, sig, tiny_model_dir):
    code, text = serve_then_stop(tmp_path, sig, ["--model-path", tiny_model_dir])
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "ERROR" not in text and "leaked" not in text, text[-3000:]
    for line in ("[server]", "[scheduler] INFO stopped", "[detokenizer] INFO stopped"):
        assert line in text, text[-3000:]


@pytest.mark.skipif(
    not router_available(), reason="smg is not installed (the test extra brings it)"
)
def test_group_ctrl_c_stops_replicas_and_router_cleanly(tmp_path, tiny_model_dir):
    code, text = serve_then_stop(
        tmp_path, signal.SIGINT, ["--model-path", tiny_model_dir, "--dp-size", "2"]
    )
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    assert text.count("[scheduler] INFO stopped") == 2, text[-3000:]
