"""/start_profile writes only inside the operator's directory (serving/backend/step_profiler.py): a
request's output_dir must resolve to --profile-dir or inside it. Truth: the directories the test
builds (`..`, a symlink out, an absolute path elsewhere) and what exists on disk afterwards."""

from __future__ import annotations

import os

import pytest

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.serving.backend.step_profiler import (
    StepProfiler,
    check_output_dir,
    profile_root,
)


def test_output_dir_must_resolve_inside_the_profile_dir(tmp_path):
    root = str(tmp_path / "profiles")
    os.makedirs(root)
    os.symlink(tmp_path, os.path.join(root, "out"))  # a link back out of the root
    assert check_output_dir(None, root) == root and check_output_dir("", root) == root
    assert check_output_dir(root, root) == root
    assert check_output_dir(os.path.join(root, "run1"), root) == os.path.join(root, "run1")
    assert check_output_dir("run2", root) == os.path.join(root, "run2")  # relative: inside
    for bad in (str(tmp_path), "/etc", os.path.join(root, "..", "x"), "../x", root + "-evil"):
        with pytest.raises(ValueError, match="output_dir"):
            check_output_dir(bad, root)
    with pytest.raises(ValueError, match="output_dir"):
        check_output_dir(os.path.join(root, "out", "x"), root)


def test_the_default_is_profiles_in_the_cache_dir_and_a_refusal_creates_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("SGLANG_TORCH_PROFILER_DIR", raising=False)
    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))
    assert profile_root(ServerConfig()) == str(tmp_path / "cache" / "profiles")
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path / "sglang"))
    assert profile_root(ServerConfig()) == str(tmp_path / "sglang")
    profiler = StepProfiler(ServerConfig(profile_dir=str(tmp_path / "mine")))
    ok, text = profiler.start(str(tmp_path / "elsewhere"), None)
    assert not ok and "output_dir" in text
    assert sorted(os.listdir(tmp_path)) == [] and profiler.prof is None


def test_a_trace_lands_inside_and_answers_name_no_absolute_path(tmp_path):
    profiler = StepProfiler(ServerConfig(profile_dir=str(tmp_path / "mine")))
    ok, text = profiler.start("run", None)
    assert ok and "<profile-dir>/run" in text and str(tmp_path) not in text
    ok, text = profiler.stop()
    assert ok and str(tmp_path) not in text
    (trace,) = os.listdir(tmp_path / "mine" / "run")
    assert trace.startswith("radixrt-") and trace in text
    assert os.stat(tmp_path / "mine").st_mode & 0o077 == 0
