"""Mooncake's transfer engine (kvcache-ai/Mooncake, `mooncake-transfer-engine-non-cuda` on a CPU
machine, `mooncake-transfer-engine` with CUDA): TCP transport, its P2P handshake (each engine is
reached at host:rpc_port, so no etcd or metadata server runs). The prefill server writes into the
decode server's registered pool memory; nothing of ours is on the data path."""

from __future__ import annotations

import os
from typing import Any

INSTALL_HINT = (
    "prefill-decode disaggregation moves the KV with Mooncake's transfer engine: pip install "
    "mooncake-transfer-engine-non-cuda (CPU; the CUDA build is mooncake-transfer-engine), and on "
    "Debian/Ubuntu apt-get install libibverbs1 librdmacm1 libnuma1"
)


class MooncakeEngine:
    def __init__(self, host: str, ib_device: str | None = None):
        """host: the address the peer reaches this engine at. ib_device: handed to Mooncake (its
        RDMA transport's devices; the TCP transport does not use it)."""
        # glog: Mooncake logs each handshake; its failures come back as return codes we report
        os.environ.setdefault("GLOG_minloglevel", "2")
        try:
            from mooncake.engine import TransferEngine
        except ImportError as e:
            raise RuntimeError(f"{INSTALL_HINT} ({e})") from None
        self.engine = TransferEngine()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", "tcp", ib_device or "")
        if rc != 0:
            raise RuntimeError(f"Mooncake's transfer engine did not start on {host} (code {rc})")
        self.session = f"{host}:{self.engine.get_rpc_port()}"

    def register(self, tensors: list[Any]) -> None:
        """Let peers read and write these tensors' memory (the KV pool)."""
        for t in tensors:
            rc = self.engine.register_memory(t.data_ptr(), t.numel() * t.element_size())
            if rc != 0:
                raise RuntimeError(f"Mooncake could not register the KV pool memory (code {rc})")

    def unregister(self, tensors: list[Any]) -> None:
        for t in tensors:
            self.engine.unregister_memory(t.data_ptr())

    def write(self, peer: str, srcs: list[int], dsts: list[int], lens: list[int]) -> None:
        """Copy each local region into the peer's memory; returns when all of it landed."""
        rc = self.engine.batch_transfer_sync_write(peer, srcs, dsts, lens)
        if rc != 0:
            raise RuntimeError(f"Mooncake's write to {peer} failed (code {rc})")
