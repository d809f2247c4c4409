"""A grammar compile worker: `python -m radixrt.runtime.constrained.compile_worker`, started by
compile_pool.py. The parent's frames on stdin are a 4-byte big-endian length and JSON. The first
sets it up: (token_map as [hex, ids] pairs | None, fsm_eos, memory_bytes); then (job, key) each.
Results go back on a pipe of their own (the fd in RESULT_FD_ENV: a native library's print to stdout
cannot corrupt them) as JSON and raw bytes, never a pickle: a worker compiles hostile grammars, and
a pickle from a worker whose memory such a grammar corrupted would run code in the server
(write_result / read_result; an outlines-core Index travels as its own binary form).

A plain subprocess, not multiprocessing: spawning through multiprocessing re-imports the user's main
module, which an Engine() script without an `if __name__ == "__main__"` guard cannot survive.
Imports only the torch-free spec modules, budget.py, stop_regex.py, outlines-core and interegular.
"""

from __future__ import annotations

import os
import resource
import struct
import sys
from typing import Any, BinaryIO

WORKER_NICENESS = 10


def read_frame(f: BinaryIO) -> Any:
    """The parent's frame: JSON (lists where the parent wrote tuples)."""
    import orjson

    return orjson.loads(_read_exactly(f, struct.unpack(">I", _read_exactly(f, 4))[0]))


def write_frame(f: BinaryIO, obj: Any) -> None:
    """A frame to a worker: JSON, length-prefixed (what crosses a process boundary is never a
    pickle; bytes travel as hex, see encode_token_map)."""
    import orjson

    data = orjson.dumps(obj)
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


def as_key(obj: list) -> tuple:
    """A job's key as the parent made it: JSON gave its tuples back as lists (a key is one level
    of strings and, for choices, a tuple of strings)."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in obj)


def encode_token_map(token_map: dict[Any, list[int]] | None) -> list | None:
    """The token map (token bytes or text -> ids) as JSON can carry it: [bytes as hex or None, text
    or None, ids] per token."""
    if token_map is None:
        return None
    return [
        [k.hex(), None, v] if isinstance(k, bytes) else [None, k, v] for k, v in token_map.items()
    ]


def decode_token_map(rows: list | None) -> dict[Any, list[int]] | None:
    if rows is None:
        return None
    return {bytes.fromhex(h) if h is not None else text: ids for h, text, ids in rows}


RESULT_FD_ENV = "RADIXRT_COMPILE_RESULT_FD"
MAX_RESULT_BYTES = 1 << 31


def write_result(out: BinaryIO, status: str, value: Any, blob: bytes = b"") -> None:
    """(status, a JSON value, raw bytes) as two length-prefixed parts: the JSON, then the bytes."""
    import orjson

    head = orjson.dumps([status, value])
    out.write(struct.pack(">I", len(head)) + head + struct.pack(">Q", len(blob)) + blob)
    out.flush()


def read_result(f: BinaryIO) -> tuple[str, Any, bytes]:
    """A worker's result: JSON and bytes only, each bounded (ValueError when malformed)."""
    import orjson

    head = _read_exactly(f, struct.unpack(">I", _read_exactly(f, 4))[0])
    (size,) = struct.unpack(">Q", _read_exactly(f, 8))
    if size > MAX_RESULT_BYTES:
        raise ValueError(f"a compile result of {size} bytes")
    status, value = orjson.loads(head)
    if status not in ("ok", "err"):
        raise ValueError(f"a compile result with status {status!r:.50}")
    return status, value, _read_exactly(f, size)


def index_result(value: Any, blob: bytes) -> tuple[str, bytes, Any]:
    """An "index" job's result as the pool hands it on: (regex, the Index's binary form for
    outlines_core.Index.from_binary, budget steering's tables as dicts or None)."""
    rx, tables = value
    distances = None if tables is None else tuple({k: v for k, v in t} for t in tables)
    return rx, blob, distances


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


def result_pipe() -> BinaryIO:
    """The result pipe this worker was given (stdout when run by hand)."""
    fd = os.environ.get(RESULT_FD_ENV)
    return os.fdopen(int(fd), "wb") if fd else sys.stdout.buffer


def die_with_parent() -> None:
    """Linux: SIGKILL this worker when its parent dies, even in the middle of a compile."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # elsewhere: the parent's death closes stdin, which ends the worker between jobs


def _distances(index: Any) -> Any:
    """Budget steering's table (budget.py), or None when it does not fit in memory: the grammar is
    then enforced unsteered rather than refused."""
    from radixrt.runtime.constrained.budget import completion_distances

    try:  # as JSON: each table a list of [state, distance] pairs
        return [sorted(table.items()) for table in completion_distances(index)]
    except MemoryError:
        return None


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    from outlines_core import Index, Vocabulary

    from radixrt.runtime.constrained.regex_builder import GrammarError
    from radixrt.runtime.constrained.spec import spec_regex
    from radixrt.runtime.request.stop_regex import build_seconds

    pairs, fsm_eos, memory_bytes = read_frame(inp)
    token_map = decode_token_map(pairs)
    del pairs
    die_with_parent()
    import signal

    # Ctrl-C reaches the process group; the server stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(WORKER_NICENESS)  # decoding comes first
    except OSError:
        pass
    vocab = Vocabulary(fsm_eos, token_map) if token_map is not None else None
    del token_map
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    while True:
        try:
            job, key = read_frame(inp)
            key = as_key(key)
        except EOFError:
            return
        if job == "stop_regex":  # bounds no grammar: its own refusals are in the result
            write_result(out, "ok", build_seconds(key))
            continue
        try:
            rx = spec_regex(key)
            if job == "regex":
                write_result(out, "ok", rx)
                continue
            index = Index(rx, vocab)
            write_result(out, "ok", [rx, _distances(index)], index.__reduce__()[1][0])
        except GrammarError as e:
            write_result(out, "err", str(e))
        except MemoryError:
            write_result(
                out,
                "err",
                f"the {key[0]} grammar needs more than {memory_bytes >> 20} MiB to compile",
            )
        except (ValueError, RuntimeError, OverflowError, RecursionError) as e:
            msg = str(e)
            if len(msg) > 300:
                msg = msg[:150] + " ... " + msg[-150:]
            write_result(out, "err", f"cannot compile the {key[0]} grammar: {msg}")


if __name__ == "__main__":
    serve(sys.stdin.buffer, result_pipe())
