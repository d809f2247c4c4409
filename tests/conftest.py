"""Shared fixtures: the real default model (session-scoped), a tiny Llama config, and a paged-pool driver.

Tests under tests/integration/ are auto-marked `integration` (launched servers and engines; most on the
real default model, the plumbing tests on `tiny_model_dir`).
"""

from __future__ import annotations

import os
import pathlib
import random
import sys

import pytest
import torch

from radixrt.runtime.core.page_allocator import TableRows, slots_of
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.model.forward_batch import build_forward_batch
from radixrt.runtime.model.kv_cache import KVCache, ReqToSlotTable

_INTEGRATION_DIR = pathlib.Path(__file__).parent / "integration"

# Engines and servers the tests start run their layers eager: compiling the graphs costs ~30 s per new model
# shape on a 2-core machine. The tests of the compiled path (test_compiled_layers.py, the default-config
# quality test) pass enable_torch_compile=True, which wins over this.
os.environ.setdefault("RADIXRT_DISABLE_TORCH_COMPILE", "1")

# Under pytest-xdist (two workers on 2 cores) each worker and the servers it starts use one thread:
# the suite's small batches run as fast on one core as on two, and two OpenMP teams spinning on the
# same two cores would slow both.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


# Files that bound wall-clock times or count processes: `-m serial` runs them alone, after the rest
# has run on two pytest-xdist workers (README's test command), so no other test's load moves them.
SERIAL = {
    "test_clean_stop", "test_compile_pool", "test_event_loop_bounds", "test_hardening",
    "test_lora_loads", "test_pd_agents", "test_pd_disaggregation", "test_pd_hostile_peers",
    "test_pd_wire",
    "test_process_death", "test_stop_regex_bounds", "test_tenant_battery", "test_watchdog_hang",
}  # fmt: skip
# Files that share process-wide objects run on one worker, one after another: the DSL files' engine
# (dsl_shared.py), the quality floors' transformers references (chat_references).
GROUPS = {
    "test_dsl_compat": "dsl", "test_dsl_engine": "dsl", "test_dsl_runtime": "dsl",
    "test_dsl_select": "dsl", "test_default_dtype_quality": "references",
    "test_kv_cache_dtype": "references",
}  # fmt: skip
# The longest groups first (a full run's --durations, 2-core Zen 4), so that neither worker is
# left with one long file at the end while the other idles.
LONGEST_FIRST = [
    "test_compiled_layers", "references", "test_grammar_backends", "test_sglang_client", "dsl",
    "test_agent_api", "test_tensor_parallel", "test_constrained_prefixes",
    "test_engine_greedy", "test_beam_search_engine", "test_deterministic_inference",
]  # fmt: skip


# Files whose tests share nothing but a folder of their own: each test its own group, so that the
# two cold compiles (~150 s each) run on both workers at once.
SPLIT = {"test_compiled_layers"}


def group_of(item) -> str:
    """The item's xdist group: its file's, or the group its file shares (a SPLIT file's: the test's)."""
    name = pathlib.Path(str(item.fspath)).stem
    if name in SPLIT:  # no "]" in a group: xdist would read the test's id as its group
        return f"{name}::{item.name.replace('[', '-').replace(']', '')}"
    return GROUPS.get(name, name)


# before pytest-xdist's own hook, which reads the xdist_group marks into each test's id
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _INTEGRATION_DIR in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
        if pathlib.Path(str(item.fspath)).stem in SERIAL:
            item.add_marker(pytest.mark.serial)
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(group_of(item), len(first_seen))
    rank = {g: i for i, g in enumerate(LONGEST_FIRST)}

    def order(item) -> tuple[int, int]:
        group = group_of(item)
        return rank.get(group.split("::")[0], len(rank)), first_seen[group]

    items.sort(key=order)  # stable: a file's tests keep their order, a group's files stay together


def pytest_runtest_teardown(item, nextitem):
    """After the last DSL file, its shared engine goes (it holds ~2 GB)."""
    if group_of(item) == "dsl" and (nextitem is None or group_of(nextitem) != "dsl"):
        sys.modules["dsl_shared"].release()  # imported by every DSL file


@pytest.fixture(scope="session")
def model_dir() -> pathlib.Path:
    from radixrt.runtime.model.weights import transformers_dir

    return transformers_dir()


@pytest.fixture(scope="session")
def hf_model(model_dir):
    import hf_reference

    return hf_reference.hf_model()


@pytest.fixture(scope="session")
def chat_references(hf_model, tokenizer):
    """transformers' float32 greedy continuations (and their log-probs) of the benchmarks' 24 chat
    prompts, NUM_TOKENS each: the teacher-forced quality tests' truth, computed once per session
    (~11 s on 2 cores, batched) for the default dtype's and the KV dtypes' floors alike."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "benchmarks"))
    from bench_kv_cache import NUM_TOKENS, QUESTIONS, references

    return references(hf_model, tokenizer, QUESTIONS, NUM_TOKENS)


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from radixrt.runtime.model.weights import load_tokenizer

    return load_tokenizer(model_dir)


# the tiny Llama shape: 2 layers, 4 query / 2 KV heads (GQA)
TINY_LLAMA_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    """A tiny random Llama with the default model's tokenizer, saved once per session: the model of
    every test where the real model is not the point (HTTP, scheduling, hostile inputs, processes,
    the Triton interpreter). Its weights are far from init (model_cases.randomize), so greedy picks
    sit far from ties."""
    from model_cases import save_random_model
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("tiny-default-tokenizer")
    config = LlamaConfig(**TINY_LLAMA_SHAPE, tie_word_embeddings=True)
    save_random_model(config, tokenizer, path, max_positions=4096)
    return str(path)


@pytest.fixture
def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        **TINY_LLAMA_SHAPE,
        vocab_size=128,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


class PagedDriver:
    """Runs a model over the paged pool the way the runner does: pages from a shuffled free list
    (so each request's slots are scattered), one build_forward_batch per step, decode items first."""

    def __init__(
        self,
        model,
        attn,
        num_pages: int = 256,
        page_size: int = 1,
        max_rows: int = 32,
        max_context: int | None = None,
        seed: int = 0,
    ):
        self.model, self.attn, self.page_size = model, attn, page_size
        self.kv = KVCache(
            model.num_layers,
            num_pages * page_size,
            model.num_kv_heads,
            model.head_dim,
            model.attn_dtype,
            model.device,
        )
        self.table = ReqToSlotTable(max_rows, max_context or model.max_context, model.device)
        self.rows = TableRows(max_rows)
        self.free_pages = list(range(num_pages))
        random.Random(seed).shuffle(self.free_pages)
        self.reqs: dict[str, dict] = {}
        # the forward of a planned batch (a test may route some batches elsewhere)
        self.forward = lambda fb: self.model.forward(fb, self.kv, self.attn)

    def step(self, feeds: list[tuple[str, list[int], bool]]) -> dict[str, torch.Tensor]:
        """feeds: (request name, new token ids, want logits for every new token). Returns logits per name:
        [len(new_ids), vocab] when all were wanted, else [1, vocab] for the last token."""
        is_decode = [
            len(ids) == 1 and not all_rows and self.reqs.get(name, {}).get("computed_len", 0) > 0
            for name, ids, all_rows in feeds
        ]
        order = [f for f, d in zip(feeds, is_decode) if d] + [
            f for f, d in zip(feeds, is_decode) if not d
        ]
        items = []
        for name, ids, all_rows in order:
            if name not in self.reqs:
                self.reqs[name] = {"row": self.rows.alloc(), "pages": [], "computed_len": 0}
            req = self.reqs[name]
            prefix_len = req["computed_len"]
            seq_len = prefix_len + len(ids)
            while len(req["pages"]) * self.page_size < seq_len:
                req["pages"].append(self.free_pages.pop())
            items.append(
                PlanItem(
                    row=req["row"],
                    new_ids=list(ids),
                    computed_len=prefix_len,
                    slots=slots_of(req["pages"], prefix_len, seq_len, self.page_size),
                    write_start=prefix_len,
                    logits_start=0 if all_rows else None,
                )
            )
            req["computed_len"] = seq_len
        fb = build_forward_batch(items, self.table.table, self.model.device)
        with torch.inference_mode():
            self.attn.init_forward_metadata(fb)
            logits = self.forward(fb)
        assert (
            logits.shape == (fb.logits_rows.shape[0], self.model.vocab_size)
            and logits.dtype == torch.float32
        )
        out, row = {}, 0
        for name, ids, all_rows in order:
            n = len(ids) if all_rows else 1
            out[name] = logits[row : row + n]
            row += n
        assert row == logits.shape[0]
        return out

    def share(self, name: str, source: str, length: int) -> None:
        """A new request whose first `length` positions read source's slots, as a radix-cache hit
        does (page_size 1)."""
        assert self.page_size == 1 and self.reqs[source]["computed_len"] >= length
        row = self.rows.alloc()
        pages = list(self.reqs[source]["pages"][:length])
        self.table.table[row, :length] = torch.tensor(pages, dtype=self.table.table.dtype)
        self.reqs[name] = {"row": row, "pages": pages, "computed_len": length, "borrowed": length}

    def release(self, name: str) -> None:
        req = self.reqs.pop(name)
        self.free_pages.extend(req["pages"][req.get("borrowed", 0) :])
        self.rows.free(req["row"])


@pytest.fixture
def paged_driver():
    """The PagedDriver class (fixtures cannot be imported from conftest as a module)."""
    return PagedDriver
