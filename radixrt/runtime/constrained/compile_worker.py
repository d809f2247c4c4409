"""A grammar compile worker: `python -m radixrt.runtime.constrained.compile_worker`, started by
compile_pool.py. Frames on stdin/stdout are a 4-byte big-endian length and a pickle (parent and
child are the same program). The first frame sets it up: (token_map | None, fsm_eos, memory_bytes).

A plain subprocess, not multiprocessing: spawning through multiprocessing re-imports the user's main
module, which an Engine() script without an `if __name__ == "__main__"` guard cannot survive.
Imports only the torch-free spec modules, budget.py, stop_regex.py, outlines-core and interegular.
"""

from __future__ import annotations

import os
import pickle
import resource
import struct
import sys
from typing import Any, BinaryIO

WORKER_NICENESS = 10


def read_frame(f: BinaryIO) -> Any:
    head = f.read(4)
    if len(head) < 4:
        raise EOFError
    (n,) = struct.unpack(">I", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def write_frame(f: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


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

    try:
        return completion_distances(index)
    except MemoryError:
        return None


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    from outlines_core import Index, Vocabulary

    from radixrt.runtime.constrained.regex_builder import GrammarError
    from radixrt.runtime.constrained.spec import spec_regex
    from radixrt.runtime.request.stop_regex import build_seconds

    token_map, fsm_eos, memory_bytes = read_frame(inp)
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
        except EOFError:
            return
        if job == "stop_regex":  # bounds no grammar: its own refusals are in the result
            write_frame(out, ("ok", build_seconds(key)))
            continue
        try:
            rx = spec_regex(key)
            if job == "regex":
                write_frame(out, ("ok", rx))
                continue
            index = Index(rx, vocab)
            write_frame(out, ("ok", (rx, pickle.dumps(index), _distances(index))))
        except GrammarError as e:
            write_frame(out, ("err", str(e)))
        except MemoryError:
            write_frame(
                out,
                (
                    "err",
                    f"the {key[0]} grammar needs more than {memory_bytes >> 20} MiB to compile",
                ),
            )
        except (ValueError, RuntimeError, OverflowError, RecursionError) as e:
            msg = str(e)
            if len(msg) > 300:
                msg = msg[:150] + " ... " + msg[-150:]
            write_frame(out, ("err", f"cannot compile the {key[0]} grammar: {msg}"))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
