"""The second cache tier's storage (--enable-hierarchical-cache): pages of the KV pool copied to
host memory, or to a memory-mapped file (--hicache-storage-backend file), and back. The tree side is
core/tiered_cache.py.

A tier page is one contiguous record: for every layer, its page_size tokens of K, then V (then the
int8/fp8 scales), as raw bytes, so any KV dtype is copied alike and a page is checksummed in one
call. A write or a read is one batched copy per pool tensor (index_select / index_copy_ over all
pages of the call).

The file tier: a header (magic, format version, and the fingerprint of what the bytes mean: model,
dtypes, page size, layer and head counts, record size), a crc32 per page, then the records. Each
process creates its own file, mode 0600, with no name: O_TMPFILE where the file system has it, else
a fresh name unlinked right after it is opened (its disk space reserved at start). It lives as long
as the process holds it open, so a SIGKILLed server leaves no one's KV on disk and no other process
can open it by name; the tier does not survive a restart (the tree that indexes it lives in the
process), so KV written by another model or dtype can never be served. A page whose checksum fails
on a load is reported to the tree, which drops it and recomputes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import tempfile
import zlib
from typing import Any

import numpy as np
import torch

from radixrt.runtime.model.kv_cache import KVCache

log = logging.getLogger(__name__)

MAGIC = b"RADIXRT-KV-TIER\n"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
FILE_PREFIX = "radixrt-kv-tier-"


class KVTierStore:
    def __init__(
        self,
        kv: KVCache,
        page_size: int,
        num_pages: int,
        fingerprint: dict[str, Any],
        directory: str | None = None,
    ):
        if num_pages < 1:
            raise ValueError(f"the second cache tier needs at least one page, got {num_pages}")
        self.parts = kv.tensors()
        self.pool_pages = self.parts[0].shape[0] // page_size
        self.part_bytes = [t[0].numel() * t.element_size() * page_size for t in self.parts]
        self.page_bytes = kv.page_bytes(page_size)
        self.num_pages = num_pages
        self.device = self.parts[0].device
        self.header = self._header(fingerprint)
        self.file: Any = None  # the tier file (unlinked), or None for host memory
        self.checksums: np.ndarray | None = None
        if directory is None:
            self.data = torch.empty(
                (num_pages, self.page_bytes),
                dtype=torch.uint8,
                pin_memory=self.device.type == "cuda",
            )
        else:
            self.data = self._open_file(directory)

    def _header(self, fingerprint: dict[str, Any]) -> bytes:
        meta = dict(
            fingerprint,
            format_version=FORMAT_VERSION,
            page_bytes=self.page_bytes,
            num_pages=self.num_pages,
        )
        head = MAGIC + json.dumps(meta, sort_keys=True).encode()
        if len(head) > HEADER_BYTES:
            raise ValueError("the tier file's header does not fit")
        return head.ljust(HEADER_BYTES, b"\0")

    def _open_file(self, directory: str) -> torch.Tensor:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise ValueError(
                f"--hicache-storage-dir {directory!r} cannot be created: {e}"
            ) from None
        sums_bytes = -(-self.num_pages * 4 // HEADER_BYTES) * HEADER_BYTES
        total = HEADER_BYTES + sums_bytes + self.num_pages * self.page_bytes
        free = shutil.disk_usage(directory).free
        if total > free:
            raise ValueError(
                f"the file tier needs {total / 2**30:.2f} GiB but {directory!r} has "
                f"{free / 2**30:.2f} GiB free (lower --hicache-size or --hicache-ratio)"
            )
        _remove_stale_files(directory)
        try:
            self.file = os.fdopen(_open_unnamed(directory), "r+b")
            _reserve(self.file.fileno(), total)
            self._mm = np.memmap(self.file, dtype=np.uint8, mode="r+", shape=(total,))
        except OSError as e:
            if self.file is not None:
                self.file.close()
                self.file = None
            raise ValueError(
                f"cannot create the tier file in {directory!r} ({total / 2**30:.2f} GiB): {e}"
            ) from None
        self._mm[:HEADER_BYTES] = np.frombuffer(self.header, dtype=np.uint8)
        self._mm.flush()
        self.check_header()
        self.checksums = self._mm[HEADER_BYTES : HEADER_BYTES + self.num_pages * 4].view(np.uint32)
        records = self._mm[HEADER_BYTES + sums_bytes :].reshape(self.num_pages, self.page_bytes)
        return torch.from_numpy(records)

    def check_header(self) -> None:
        """The file still says what its bytes are (ValueError naming the problem otherwise)."""
        if self.file is None:
            return
        try:
            head = os.pread(self.file.fileno(), HEADER_BYTES, 0)
        except OSError as e:
            raise ValueError(f"the tier file cannot be read: {e}") from None
        if not head.startswith(MAGIC):
            raise ValueError("the tier file is not a radixrt KV tier file (bad magic)")
        if head != self.header:
            raise ValueError(
                "the tier file was written for another model, dtype or layout (header mismatch)"
            )

    def _pool_views(self) -> list[torch.Tensor]:
        return [t.view(torch.uint8).view(self.pool_pages, -1) for t in self.parts]

    def write(self, pool_pages: list[int], tier_pages: list[int]) -> None:
        """Copy pool pages into tier pages (and checksum them, for the file)."""
        src = torch.tensor(pool_pages, dtype=torch.long, device=self.device)
        dst = torch.tensor(tier_pages, dtype=torch.long)
        off = 0
        for view, nbytes in zip(self._pool_views(), self.part_bytes):
            self.data[:, off : off + nbytes].index_copy_(0, dst, view.index_select(0, src).cpu())
            off += nbytes
        if self.checksums is not None:
            records = self.data.numpy()
            for p in tier_pages:
                self.checksums[p] = zlib.crc32(records[p])

    def read(self, tier_pages: list[int], pool_pages: list[int]) -> int | None:
        """Copy tier pages back into pool pages; the index of the first page whose checksum failed
        (it and the pages after it are not copied), or None when all were good."""
        bad = None
        if self.checksums is not None:
            try:
                self.check_header()
            except ValueError as e:
                log.error("second cache tier: %s; recomputing instead", e)
                return 0
            records = self.data.numpy()
            for i, p in enumerate(tier_pages):
                if zlib.crc32(records[p]) != self.checksums[p]:
                    log.error("second cache tier: page %d fails its checksum; recomputing it", p)
                    bad = i
                    break
        n = len(tier_pages) if bad is None else bad
        if n:
            src = torch.tensor(tier_pages[:n], dtype=torch.long)
            dst = torch.tensor(pool_pages[:n], dtype=torch.long, device=self.device)
            off = 0
            for view, nbytes in zip(self._pool_views(), self.part_bytes):
                view.index_copy_(
                    0, dst, self.data[:, off : off + nbytes].index_select(0, src).to(self.device)
                )
                off += nbytes
        return bad

    def close(self) -> None:
        """The file's space goes back with its last descriptor and mapping (it has no name)."""
        if self.file is not None:
            del self.data, self._mm, self.checksums
            self.file.close()
            self.file = None


def _open_unnamed(directory: str) -> int:
    """A new file in directory, read-write, mode 0600, that no name reaches: O_TMPFILE, or (a file
    system without it) a fresh name unlinked at once."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError) as e:  # AttributeError: no O_TMPFILE on this OS
        if isinstance(e, OSError) and e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    # pid plus random: two processes sharing the directory (other PID namespaces too) never
    # share a name
    path = os.path.join(directory, f"{FILE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.unlink(path)
    except OSError:
        os.close(fd)
        raise
    return fd


def _reserve(fd: int, size: int) -> None:
    """Take the file's disk space now: a full disk is an error at start, not a SIGBUS when a page
    of a sparse file is first written."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
            raise
        os.ftruncate(fd, size)


def _remove_stale_files(directory: str) -> None:
    """Named tier files of processes that died without closing them (left by versions before the
    file was unlinked at creation): nothing can read them again. (A file of a live process in
    another PID namespace may go too: its mapping stays valid, only its name goes.)"""
    for name in os.listdir(directory):
        pid = name.removeprefix(FILE_PREFIX).split("-")[0]
        if name.startswith(FILE_PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def open_kv_tier(
    config: Any,
    kv: KVCache,
    page_size: int,
    pool_pages: int,
    fingerprint: dict[str, Any],
    available_bytes: int,
) -> KVTierStore:
    """The tier --hicache-size (GB) or --hicache-ratio (x the pool) asks for, in RAM or a file."""
    page_bytes = kv.page_bytes(page_size)
    num_pages = (
        int(config.hicache_size * 1e9) // page_bytes
        if config.hicache_size
        else int(pool_pages * config.hicache_ratio)
    )
    directory = None
    if config.hicache_storage_backend == "file":
        directory = config.hicache_storage_dir or os.path.join(
            tempfile.gettempdir(), "radixrt-hicache"
        )
    elif num_pages * page_bytes > available_bytes:
        raise ValueError(
            f"the second cache tier wants {num_pages * page_bytes / 2**30:.2f} GiB of host memory, "
            f"{available_bytes / 2**30:.2f} GiB is available (lower --hicache-size or "
            f"--hicache-ratio, or use --hicache-storage-backend file)"
        )
    store = KVTierStore(kv, page_size, num_pages, fingerprint, directory)
    log.info(
        "second cache tier: %d pages (%d tokens, %.1f MiB) in %s, write policy %s",
        num_pages,
        num_pages * page_size,
        num_pages * page_bytes / 2**20,
        f"an unlinked file in {directory}" if store.file else "host memory",
        config.hicache_write_policy,
    )
    return store
