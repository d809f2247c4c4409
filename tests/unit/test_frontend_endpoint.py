"""RuntimeEndpoint over real HTTP against a stdlib server that fronts the fake runtime
with SGLang's /generate wire format (cumulative SSE text, error bodies, 404s)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from frontend_fake_backend import SMOLLM_TEMPLATE, FakeBackend

import radixrt as sgl
from radixrt.frontend.launcher import server_command
from radixrt.runtime.processes import free_port


def _serve(
    fake: FakeBackend, *, pin: bool = True, tokenize: bool = True, api_key: str | None = None
):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": {"message": "invalid API key"}})
                return False
            return True

        def do_GET(self):
            if not self._authorized():
                return
            if self.path == "/get_model_info":
                self._send(200, {"model_path": "fake", "chat_template": SMOLLM_TEMPLATE})
            elif self.path == "/health":
                self._send(200, {})
            elif self.path == "/get_server_info":
                self._send(200, fake.get_server_info())
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self):
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/tokenize" and tokenize:
                self._send(200, {"tokens": fake.tokenize(body["text"])})
            elif self.path == "/pin_prefix" and pin:
                self._send(200, {"handle": fake.pin_prefix(body["text"], body.get("program_id"))})
            elif self.path == "/unpin" and pin:
                fake.unpin(body["handle"])
                self._send(200, {"success": True})
            elif self.path == "/flush_cache":
                self._send(200, {"success": fake.flush_cache()})
            elif self.path == "/generate":
                self._generate(body)
            else:
                self._send(404, {"error": {"message": "not found"}})

        def _generate(self, body: dict) -> None:
            stream = body.pop("stream", False)
            payload = {"prompt": body.pop("text", None), **body}
            try:
                result = fake._generate(**payload)
            except ValueError as e:
                self._send(400, {"error": {"message": str(e), "type": "invalid_request_error"}})
                return
            if not stream:
                self._send(200, result)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            text = ""
            for piece in [result["text"][:3], result["text"][3:]]:
                text += piece
                event = {**result, "text": text}  # SGLang streams the text so far
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@sgl.function
def program(s, topic):
    s += sgl.user("Tell me about " + topic)
    s += sgl.assistant(sgl.gen("fact", max_tokens=8))
    forks = s.fork(2)
    forks += lambda i: sgl.user(f"Variant {i}") + sgl.assistant(sgl.gen("v", max_tokens=4))
    forks.join()
    s += sgl.user("Good?") + sgl.assistant(sgl.select("ok", choices=["yes", "no"]))


def _fake() -> FakeBackend:
    return FakeBackend(
        respond=lambda p, sp: " about " + str(len(p)) + " chars", logprobs={"yes": -0.5, "no": -2.0}
    )


@pytest.mark.parametrize("pin", [True, False])
def test_same_program_same_result_over_http_and_in_process(pin):
    direct = _fake()
    truth = program.run(topic="owls", backend=direct)
    served = _fake()
    server, url = _serve(served, pin=pin)
    try:
        state = program.run(topic="owls", backend=sgl.RuntimeEndpoint(url))
        assert state.text() == truth.text() and state["v"] == truth["v"] and state["ok"] == "yes"
        assert served.pin_log == (direct.pin_log if pin else [])
        assert not served.pins
        streamed = program.run(topic="owls", backend=url, stream=True)
        assert "".join(streamed.text_iter("fact")) == truth["fact"]
    finally:
        server.shutdown()


def test_select_over_http_without_a_tokenizer_still_scores_after_the_prefix():
    served = FakeBackend(logprobs={"yes": -0.5, "no": -2.0})
    server, url = _serve(served, tokenize=False)
    try:

        @sgl.function
        def prog(s):
            s += "Q?\n" + sgl.select("a", choices=["no", "yes"])

        assert prog.run(backend=sgl.RuntimeEndpoint(url))["a"] == "yes"
        assert served.log[1]["logprob_start_len"] == 3
    finally:
        server.shutdown()


def test_server_errors_name_the_url_and_the_users_line():
    server, url = _serve(_fake())
    try:

        @sgl.function
        def prog(s):
            s += "x" + sgl.gen("y", temperature=-1.0)  # THE_LINE

        with pytest.raises(sgl.ProgramError) as info:
            prog.run(backend=sgl.RuntimeEndpoint(url))
        message = str(info.value)
        assert "temperature" in message and "THE_LINE" in message and url in message
    finally:
        server.shutdown()


def test_a_backend_that_is_down_fails_naming_the_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(ConnectionError, match=url.replace(".", r"\.")):
        sgl.RuntimeEndpoint(url)
    with pytest.raises(ValueError, match="URL"):
        sgl.RuntimeEndpoint("localhost:30000")


def test_api_key_is_sent_and_a_wrong_one_is_a_clear_error():
    server, url = _serve(_fake(), api_key="sekret")
    try:
        with pytest.raises(PermissionError, match="api_key"):
            sgl.RuntimeEndpoint(url)
        assert sgl.RuntimeEndpoint(url, api_key="sekret").flush_cache() is True
    finally:
        server.shutdown()


def test_runtime_command_line_is_built_from_server_config_fields():
    cmd = server_command(
        free_port(), None, {"page_size": 16, "disable_radix_cache": True, "log_level": "error"}
    )
    assert cmd[1:4] == ["-m", "radixrt.cli", "serve"]
    assert "--page-size" in cmd and cmd[cmd.index("--page-size") + 1] == "16"
    assert "--disable-radix-cache" in cmd and "--enable-jump-forward" not in cmd
    # the parser the server itself uses reads the flags back to the same config
    import argparse

    from radixrt.runtime.config import ServerConfig

    parser = argparse.ArgumentParser()
    ServerConfig.add_cli_args(parser)
    config = ServerConfig.from_cli_args(parser.parse_args(cmd[4:]))
    assert config.page_size == 16 and config.disable_radix_cache and config.log_level == "error"
    # a field that defaults to True can be turned off on the command line
    off = server_command(1, None, {"enable_jump_forward": False})
    assert "--no-enable-jump-forward" in off
    assert not ServerConfig.from_cli_args(parser.parse_args(off[4:])).enable_jump_forward
    with pytest.raises(ValueError, match="not_a_flag"):
        server_command(1, None, {"not_a_flag": 1})


def test_the_dsl_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, radixrt as sgl\n"
        "from radixrt.frontend import api, backends, endpoint, interpreter, launcher, state, tracer\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
