"""The file tier (model/kv_tier.py, --hicache-storage-backend file) has no name from the moment it is
created: nothing a SIGKILL could leave on disk, nothing another process could open by path. Truth:
the directory's listing and the descriptor's own stat (no links, mode 0600); pages still travel
exactly (a pool page written to the tier and read back into another equals the original), with
O_TMPFILE and with the fallback (a name unlinked at once)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

from radixrt.runtime.model import kv_tier
from radixrt.runtime.model.kv_cache import KVCache

PAGE = 4


def make_store(directory):
    kv = KVCache(num_layers=2, num_slots=8 * PAGE, num_kv_heads=2, head_dim=4, dtype=torch.float32)
    for t in kv.tensors():
        t.copy_(torch.randn(t.shape))
    return kv, kv_tier.KVTierStore(kv, PAGE, 3, {"model": "unit"}, str(directory))


def assert_round_trip(kv, store):
    store.write([1], [2])
    assert store.read([2], [5]) is None
    for t in kv.tensors():
        assert torch.equal(t[5 * PAGE : 6 * PAGE], t[1 * PAGE : 2 * PAGE])


@pytest.mark.parametrize("tmpfile", [True, False], ids=["O_TMPFILE", "unlinked-name"])
def test_the_tier_file_has_no_name_and_mode_0600(tmp_path, monkeypatch, tmpfile):
    if not tmpfile:
        monkeypatch.delattr(os, "O_TMPFILE", raising=False)
    kv, store = make_store(tmp_path)
    try:
        assert os.listdir(tmp_path) == []
        st = os.fstat(store.file.fileno())
        assert st.st_nlink == 0 and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size > 3 * store.page_bytes  # the space was reserved
        assert_round_trip(kv, store)
        store.check_header()
    finally:
        store.close()
    assert os.listdir(tmp_path) == [] and store.file is None


def test_a_sigkilled_process_leaves_no_tier_file(tmp_path):
    """A child creates the tier and is killed with it open: the directory stays empty."""
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_kv_tier_file import make_store
        kv, store = make_store({str(tmp_path)!r})
        store.write([0], [0])
        print("open", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and proc.stdout.strip() == "open", proc.stderr
    assert os.listdir(tmp_path) == []


def test_a_foreign_header_is_refused(tmp_path):
    kv, store = make_store(tmp_path)
    try:
        fd = store.file.fileno()
        head = os.pread(fd, kv_tier.HEADER_BYTES, 0)
        os.pwrite(fd, bytes([head[len(kv_tier.MAGIC) + 1] ^ 1]), len(kv_tier.MAGIC) + 1)
        with pytest.raises(ValueError, match="another model"):
            store.check_header()
        assert store.read([0], [0]) == 0
    finally:
        store.close()
