"""Process-wide model objects shared by the DSL integration tests (loaded once)."""

from __future__ import annotations

import functools
import os

from hf_reference import hf_model


@functools.lru_cache(maxsize=None)
def engine_backend():
    """One engine for the four DSL test files, which run one after another on one worker (the
    "dsl" group in conftest.py); release() shuts it down after the last of them."""
    import radixrt as sgl

    return sgl.EngineBackend(sgl.Engine(dtype="float32"))


def release() -> None:
    if engine_backend.cache_info().currsize:
        engine_backend().shutdown()
        engine_backend.cache_clear()


def hf_prompt_logprobs(ids: list[int]) -> list[float]:
    """log P(ids[i] | ids[:i]) for i >= 1, from transformers."""
    import torch

    with torch.no_grad():
        logits = hf_model()(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]


def hf_greedy(ids: list[int], max_new_tokens: int, eos_ids: tuple[int, ...] = (2,)) -> list[int]:
    import torch

    with torch.no_grad():
        out = hf_model().generate(
            torch.tensor([ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos_ids),
            pad_token_id=eos_ids[0],
        )
    new = out[0, len(ids) :].tolist()
    return new[: new.index(eos_ids[0]) + 1] if eos_ids[0] in new else new


def runtime_available() -> bool:
    import importlib.util

    return importlib.util.find_spec(
        "radixrt.runtime.serving.launch.launch"
    ) is not None and not os.environ.get("RADIXRT_NO_SERVE")


class Recorder:
    """Wraps a backend's transport to record every request and its meta_info."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[tuple[dict, list[dict]]] = []

    def __enter__(self):
        original = self.backend._generate

        def recording(**payload):
            result = original(**payload)
            results = result if isinstance(result, list) else [result]
            self.calls.append((payload, [r["meta_info"] for r in results]))
            return result

        self._original = original
        self.backend._generate = recording
        return self

    def __exit__(self, *exc):
        del self.backend._generate  # back to the class's method

    def metas(self):
        return [m for _, ms in self.calls for m in ms]
