"""--enable-hierarchical-cache: token-identical outputs with the tier off, in host memory and in a file, under
eviction, preemption, aborts and a corrupted tier file. The model is the session's tiny random Llama with the
default tokenizer (tests/conftest.py): what is checked is the tier's bookkeeping and bytes, which do not depend
on what the weights know, and the prompts tokenize as on the default model.

Truth: the same Engine configuration without the tier (greedy, float32). The tier must serve (tokens loaded
back, fewer prompt tokens computed); check_integrity holds after each scenario; the tier file has no name from
its creation (nothing is left on disk, even after a SIGKILL), its header is checked at start, each page is
checksummed.
"""

import os

import pytest

from radixrt import Engine

pytestmark = pytest.mark.integration

SYSTEM = "You are a helpful assistant. Answer briefly and precisely, in one sentence. "
GREEDY = {"temperature": 0, "max_new_tokens": 10}


def make(tier, tmp_path, model_path, **kw):
    extra = {}
    if tier:
        extra = {"enable_hierarchical_cache": True, "hicache_ratio": 6.0}
        if tier == "file":
            extra.update(hicache_storage_backend="file", hicache_storage_dir=str(tmp_path))
    return Engine(
        **{
            "model_path": model_path,
            "dtype": "float32",
            "max_total_tokens": 480,
            "page_size": 4,
            "chunked_prefill_size": 128,
            **extra,
            **kw,
        }
    )


def chat_rounds(engine, rounds=3, num_conv=6):
    """Multi-turn chats whose histories together outgrow the pool: the early turns are evicted."""
    histories = [
        f"{SYSTEM}Conversation {c}: let us talk about topic number {c * 7}. " * 3
        for c in range(num_conv)
    ]
    outputs = []
    for r in range(rounds):
        for c in range(num_conv):
            histories[c] += f"User: tell me one more fact, number {r}. Assistant:"
            out = engine.generate(histories[c], GREEDY)
            outputs.append(out["output_ids"])
            histories[c] += out["text"] + "\n"
    return outputs


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, tiny_model_dir):
    engine = make(None, tmp_path_factory.mktemp("off"), tiny_model_dir)
    try:
        chats = chat_rounds(engine)
        computed = engine.scheduler.stats.prompt_tokens - engine.scheduler.stats.cached_tokens
        batch = engine.generate(
            [f"Story {i}: once upon a time" for i in range(10)],
            {"temperature": 0, "max_new_tokens": 110, "ignore_eos": True},
        )
        assert engine.scheduler.stats.num_preemptions > 0, "the batch should outgrow the pool"
    finally:
        engine.shutdown()
    return chats, computed, [o["output_ids"] for o in batch]


@pytest.mark.parametrize("tier", ["host", "file"])
def test_outputs_are_token_identical_with_the_tier(baseline, tier, tmp_path, tiny_model_dir):
    chats, computed_off, batch_off = baseline
    engine = make(tier, tmp_path, tiny_model_dir)
    try:
        if tier == "file":  # the file is open (the tier serves below) and has no name
            assert engine.scheduler.runner.kv_tier.file is not None
            assert os.listdir(tmp_path) == []
        assert chat_rounds(engine) == chats
        s = engine.scheduler
        info = s.admin.server_info()
        assert info["hicache_tokens_loaded"] > 0 and info["hicache_hits"] > 0
        assert (
            info["hicache_bytes_loaded"]
            == info["hicache_tokens_loaded"] * info["kv_bytes_per_token"]
        )
        assert s.stats.prompt_tokens - s.stats.cached_tokens < computed_off, (
            "the tier saved no prefill"
        )
        batch = engine.generate(
            [f"Story {i}: once upon a time" for i in range(10)],
            {"temperature": 0, "max_new_tokens": 110, "ignore_eos": True},
        )
        assert [o["output_ids"] for o in batch] == batch_off, (
            "preemption with the tier changed an output"
        )
        engine.check_integrity()
        assert engine.flush_cache()
        info = s.admin.server_info()
        assert info["hicache_pages_used"] == 0 and info["kv_pages_cached"] == 0
    finally:
        engine.shutdown()


def test_a_corrupted_tier_file_is_recomputed_not_served(baseline, tmp_path, tiny_model_dir):
    chats, _, _ = baseline
    engine = make("file", tmp_path, tiny_model_dir)
    try:
        store = engine.scheduler.runner.kv_tier
        first = chat_rounds(engine, rounds=2)
        assert first == chats[: len(first)]
        used = engine.scheduler.tree.host_page_ids()
        assert used
        records = store.data.numpy()
        for p in used:  # flip a byte of every page the tier holds, behind its checksum's back
            records[p, 100] ^= 0xFF
        engine.scheduler.tree.tier_stats.checksum_failures = 0
        rest = chat_rounds(engine, rounds=3)[len(first) :]
        assert rest == chats[len(first) :], "corrupt KV reached an output"
        assert engine.scheduler.tree.tier_stats.checksum_failures > 0
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_bad_tier_settings_are_clear_errors_at_start(tmp_path, tiny_model_dir):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="hicache-storage-dir"):
        make("file", tmp_path, tiny_model_dir, hicache_storage_dir=str(blocker / "sub"))
    with pytest.raises(ValueError, match="hicache_write_policy"):
        make("host", tmp_path, tiny_model_dir, hicache_write_policy="sometimes")
    with pytest.raises(ValueError, match="host memory"):
        make("host", tmp_path, tiny_model_dir, hicache_size=10_000.0)
    with pytest.raises(ValueError, match="radix cache"):
        make("host", tmp_path, tiny_model_dir, disable_radix_cache=True)


def test_header_names_the_model_and_a_foreign_header_is_refused(tmp_path, tiny_model_dir):
    from radixrt.runtime.model.kv_tier import HEADER_BYTES, MAGIC

    engine = make("file", tmp_path, tiny_model_dir, max_total_tokens=64)
    try:
        store = engine.scheduler.runner.kv_tier
        assert os.listdir(tmp_path) == [], "the tier file has a name a SIGKILL would leave behind"
        fd = store.file.fileno()
        head = os.pread(fd, HEADER_BYTES, 0)
        assert head.startswith(MAGIC) and b"float32" in head and b'"page_size": 4' in head
        flipped = head[len(MAGIC) + 2] ^ 1  # another writer's header
        os.pwrite(fd, bytes([flipped]), len(MAGIC) + 2)
        with pytest.raises(ValueError, match="another model"):
            store.check_header()
        assert store.read([0], [0]) == 0, "nothing is loaded from a file with a foreign header"
    finally:
        engine.shutdown()


def test_quantized_pages_and_their_scales_come_back_exactly(tmp_path, tiny_model_dir):
    """int8 KV: a tier page carries the int8 values and their float32 scales; outputs equal the tier-off run."""
    outputs = {}
    for tier in (None, "file"):
        engine = make(tier, tmp_path, tiny_model_dir, kv_cache_dtype="int8")
        try:
            outputs[tier] = chat_rounds(engine, rounds=2)
            if tier:
                assert engine.scheduler.admin.server_info()["hicache_tokens_loaded"] > 0
            engine.check_integrity()
        finally:
            engine.shutdown()
    assert outputs["file"] == outputs[None]
