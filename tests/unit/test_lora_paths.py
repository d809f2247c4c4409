"""Which adapters a run-time LoRA load may read (model/lora_paths.py, lora_registry.read) and the cap
on loaded adapters (--max-loaded-loras, core/scheduler_admin.py).

Truth: the file system the test builds (a root, a directory outside it, symlinks, `..`); every
refusal tied to the path or its files has the one text REFUSED (a client cannot tell an existing
file outside the roots from a missing one inside), while its detail, for the log, names the real
reason. The registry runs on a stub model of two layers (no weights are needed to read adapters).
"""

from __future__ import annotations

import json
import logging
import os
import types

import pytest
import torch
from fake_runner import FakeRunner
from safetensors.torch import save_file
from test_scheduler import VOCAB

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.model.lora_paths import REFUSED, LoraPaths, LoraRefused
from radixrt.runtime.model.lora_registry import LoraRegistry

HIDDEN = 8
MODEL = types.SimpleNamespace(
    supports_lora=True,
    hidden_size=HIDDEN,
    num_q_heads=2,
    head_dim=4,
    num_kv_heads=1,
    intermediate_size=16,
    num_layers=2,
    dtype=torch.float32,
)


def write_adapter(path, rank=2, config=None, a_shape=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config or {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}, f)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    tensors = {
        key.format("A"): torch.randn(a_shape or (rank, HIDDEN)),
        key.format("B"): torch.randn(HIDDEN, rank),
    }
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    return str(path)


@pytest.fixture
def tree(tmp_path):
    """root/ok (an adapter), outside/secret (one outside the root), links inside root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_adapter(root / "ok")
    write_adapter(outside / "secret")
    os.symlink(outside / "secret", root / "escape")  # a directory link out of the root
    write_adapter(root / "halfway")
    os.remove(root / "halfway" / "adapter_model.safetensors")
    os.symlink(
        outside / "secret" / "adapter_model.safetensors",
        root / "halfway" / "adapter_model.safetensors",
    )
    return root, outside


def registry(root, **kw):
    config = ServerConfig(lora_dir=[str(root)], max_lora_rank=4, max_loras_per_batch=2, **kw)
    return LoraRegistry(config, MODEL, torch.device("cpu"))


def refused(reg, path, why, name="x"):
    with pytest.raises(LoraRefused) as e:
        reg.read(name, path)
    assert str(e.value) == REFUSED
    assert why in e.value.detail, e.value.detail
    return e.value


def test_an_adapter_inside_the_root_is_read_and_served(tree):
    root, _ = tree
    reg = registry(root)
    adapter = reg.read("ok", str(root / "ok"))
    assert adapter.path == os.path.realpath(root / "ok") and adapter.rank == 2
    reg.install(adapter)
    assert sorted(reg.adapters) == ["ok"]
    same = reg.read("again", str(root / "sub" / ".." / "ok"))  # `..` that stays inside
    assert same.path == adapter.path


def test_every_refusal_has_one_text_and_the_log_has_the_reason(tree, caplog):
    root, outside = tree
    reg = registry(root)
    caplog.set_level(logging.WARNING)
    cases = [
        (str(outside / "secret"), "outside every --lora-dir"),  # a real adapter, outside
        (str(root / ".." / "outside" / "secret"), "outside every --lora-dir"),  # `..`
        (str(root / "escape"), "outside every --lora-dir"),  # a symlink out of the root
        (str(root / "halfway"), "adapter_model.safetensors in"),  # one file links out
        ("/etc", "outside every --lora-dir"),
        (str(root / "missing"), "no adapter_config.json"),  # missing, inside the root
        ("", "not a path"),
    ]
    for path, why in cases:
        refused(reg, path, why)
    assert "outside every --lora-dir" in caplog.text and "no adapter_config.json" in caplog.text


def test_bad_files_inside_the_root_have_the_same_text(tree):
    root, _ = tree
    reg = registry(root)
    (root / "junk").mkdir()
    (root / "junk" / "adapter_config.json").write_text("{not json")
    refused(reg, str(root / "junk"), "unreadable")
    write_adapter(root / "prefix", config={"peft_type": "PREFIX_TUNING", "r": 2})
    refused(reg, str(root / "prefix"), "not a LoRA config")
    write_adapter(root / "shape", a_shape=(2, HIDDEN + 1))
    refused(reg, str(root / "shape"), "has shape")
    write_adapter(root / "big", rank=8)
    refused(reg, str(root / "big"), "above --max-lora-rank 4")
    write_adapter(root / "torn")
    (root / "torn" / "adapter_model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}")
    refused(reg, str(root / "torn"), "safetensors")


def test_the_operators_lora_paths_stay_loadable_outside_the_roots(tree):
    root, outside = tree
    reg = registry(root, lora_paths=[f"secret={outside / 'secret'}"])
    assert sorted(reg.adapters) == ["secret"]
    reg.unload("secret")
    reg.install(reg.read("secret", str(outside / "secret")))  # reloaded from where it was named
    refused(reg, str(outside), "outside every --lora-dir")  # its parent is not


def test_no_root_allows_no_path_and_a_root_must_be_a_directory(tree, tmp_path):
    root, _ = tree
    reg = LoraRegistry(ServerConfig(max_lora_rank=4), MODEL, torch.device("cpu"))
    refused(reg, str(root / "ok"), "none given")
    with pytest.raises(ValueError, match="lora-dir"):
        LoraPaths([str(tmp_path / "nope")], [])


def test_the_cap_on_loaded_adapters_refuses_a_load_before_reading_it():
    config = ServerConfig(page_size=1, max_loras_per_batch=2, max_loaded_loras=2)
    runner = FakeRunner(200, vocab_size=VOCAB, loras=("a", "b"), max_rows=4)
    s = Scheduler(config, runner)
    runner.read_lora = lambda name, path: pytest.fail("read past the cap")
    with pytest.raises(ValueError, match="2 LoRA adapters are loaded, the most --max-loaded-loras"):
        s.admin.load_lora("c", "/anywhere")
    with pytest.raises(ValueError, match="'a' is already loaded"):
        s.admin.load_lora("a", "/anywhere")
    s.admin.unload_lora("a")
    del runner.read_lora
    s.admin.load_lora("c", "/anywhere")
    assert sorted(runner.lora_names()) == ["b", "c"]


def test_the_cap_is_checked_at_start():
    with pytest.raises(ValueError, match="max_loaded_loras"):
        ServerConfig(max_loras_per_batch=8, max_loaded_loras=4)
    with pytest.raises(ValueError, match="lora_paths names 3 adapters"):
        ServerConfig(max_loras_per_batch=1, max_loaded_loras=2, lora_paths=["a", "b", "c"])
