"""The KV pool sized from free memory (--mem-fraction-static), checked against an independent reading of
/proc/meminfo and the model's own shape (layers x KV heads x head dim x 2 for K and V x bytes per value)."""

import pytest

from radixrt import Engine

pytestmark = pytest.mark.integration


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def test_pool_from_a_fraction_of_free_memory_and_explicit_size_wins(hf_model):
    cfg = hf_model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # float32 pool
    fraction = 0.02
    before = mem_available()
    engine = Engine(dtype="float32", mem_fraction_static=fraction)
    after = mem_available()
    try:
        info = engine.get_server_info()
        assert info["kv_bytes_per_token"] == per_token
        assert info["kv_pool_bytes"] == info["max_total_tokens"] * per_token
        # the runner read MemAvailable between these two readings, less 1 GiB of headroom
        low, high = (
            (min(before, after) - (1 << 30)) * fraction / per_token,
            (max(before, after) - (1 << 30)) * fraction / per_token,
        )
        assert 0.95 * low <= info["max_total_tokens"] <= 1.05 * high, (
            info["max_total_tokens"],
            low,
            high,
        )
        out = engine.generate("The capital of France is", {"max_new_tokens": 3, "temperature": 0})
        assert out["meta_info"]["completion_tokens"] == 3
        engine.check_integrity()
    finally:
        engine.shutdown()
    explicit = Engine(dtype="float32", mem_fraction_static=fraction, max_total_tokens=2048)
    try:
        assert explicit.get_server_info()["max_total_tokens"] == 2048
    finally:
        explicit.shutdown()


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1])
def test_bad_fraction_is_refused_by_name(value):
    with pytest.raises(ValueError, match="mem_fraction_static"):
        Engine(dtype="float32", mem_fraction_static=value)
