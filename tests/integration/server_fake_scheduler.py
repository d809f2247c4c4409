"""A scheduler without a model, following the Scheduler contract, for serving-layer tests.

`radixrt serve --scheduler-class server_fake_scheduler:FakeScheduler` (with this directory on
PYTHONPATH) serves it. Its output is the prompt echoed back token by token (so tests know the
exact text), one token per request per step, with a short sleep standing in for the forward.
A prompt that contains "CRASH" makes the process die on its next step, one with "HANG" makes its next
step never return (watchdog tests: a dead scheduler, a hung one).
"""

from __future__ import annotations

import os
import time

from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.sampling_params import SamplingParams

STEP_SECONDS = 0.01
NUM_PAGES = 512


class FakeScheduler:
    def __init__(self, config):
        from radixrt.runtime.model.weights import load_tokenizer

        self.config = config
        self.tokenizer = load_tokenizer(config.model_path)
        self.context_len = 1024
        self.model_info = {
            "model_path": config.model_path,
            "context_length": self.context_len,
            "vocab_size": len(self.tokenizer),
            "eos_token_ids": [self.tokenizer.eos_token_id],
            "is_generation": True,
        }
        self.running: dict[str, dict] = {}
        self.num_finished = 0
        self.num_added = 0  # every request that reached the scheduler
        self.crash = False
        self.hang = False
        self.num_tokens_generated = 0
        self.num_aborted = 0
        self.outputs: list[TokenOut] = []  # produced by every call, handed out by take_outputs()

    def _out(
        self, r: dict, new_ids: list[int], reason: dict | None, error: str | None = None
    ) -> TokenOut:
        return TokenOut(
            rid=r["rid"],
            new_ids=new_ids,
            finished_reason=reason,
            prompt_tokens=len(r["input_ids"]),
            completion_tokens=len(r["out"]),
            error=error,
            output_logprobs=[[-0.5, t] for t in new_ids] if r["logprob"] else [],
            output_top_logprobs=[[[-0.5, t]] for t in new_ids] if r["logprob"] else [],
        )

    @property
    def admin(self) -> FakeScheduler:
        """The admin calls (flush_cache, server_info) are this object's own."""
        return self

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        self.num_added += 1
        sp = SamplingParams.from_dict(msg.sampling_params)
        r = {
            "rid": msg.rid,
            "input_ids": msg.input_ids,
            "sp": sp,
            "out": [],
            "stream": msg.options.stream,
            "sent": 0,
            "logprob": msg.options.return_logprob,
        }
        if len(msg.input_ids) + sp.max_new_tokens > NUM_PAGES:
            reason = {"type": "abort", "message": "too long"}
            self.outputs.append(self._out(r, [], reason, error="too long for the pool"))
            return
        if "CRASH" in self.tokenizer.decode(msg.input_ids):
            self.crash = True
        if "HANG" in self.tokenizer.decode(msg.input_ids):
            self.hang = True
        self.running[msg.rid] = r

    def abort(self, rid: str) -> None:
        r = self.running.pop(rid, None)
        self.num_aborted += r is not None
        if r is not None:
            self.outputs.append(self._out(r, [], {"type": "abort", "message": "aborted"}))

    def has_work(self) -> bool:
        return bool(self.running)

    def step(self) -> bool:
        if self.crash:
            os._exit(3)
        while self.hang:  # alive, answering nothing: only the heartbeat watchdog can notice
            time.sleep(3600)
        time.sleep(STEP_SECONDS)
        outs = []
        for rid, r in list(self.running.items()):
            tok = r["input_ids"][len(r["out"]) % len(r["input_ids"])]
            r["out"].append(tok)
            self.num_tokens_generated += 1
            reason = None
            text = self.tokenizer.decode(r["out"])
            hits = [s for s in r["sp"].stop if s in text]
            if hits:
                reason = {"type": "stop", "matched": hits[0]}
            elif len(r["out"]) >= r["sp"].max_new_tokens:
                reason = {"type": "length", "length": len(r["out"])}
            if reason is not None:
                del self.running[rid]
                self.num_finished += 1
            if reason is not None or r["stream"]:
                outs.append(self._out(r, r["out"][r["sent"] :], reason))
                r["sent"] = len(r["out"])
        self.outputs += outs
        return True

    def take_outputs(self) -> list[TokenOut]:
        outs, self.outputs = self.outputs, []
        return outs

    def close(self) -> None:
        pass

    def flush_cache(self) -> bool:
        return not self.running

    def server_info(self, walk: bool = True) -> dict:
        used = sum(len(r["input_ids"]) + len(r["out"]) for r in self.running.values())
        return {
            "kv_pages_total": NUM_PAGES,
            "kv_pages_free": NUM_PAGES - used,
            "kv_pages_evictable": 0,
            "page_size": 1,
            "max_total_tokens": NUM_PAGES,
            "num_running": len(self.running),
            "num_waiting": 0,
            "num_preemptions": 0,
            "cache_hit_rate": 0.0,
            "num_requests_finished": self.num_finished,
            "num_added": self.num_added,
            "num_tokens_generated": self.num_tokens_generated,
            "num_aborted": self.num_aborted,
            "pid": os.getpid(),
        }

    def check_integrity(self) -> None:
        pass
