"""The C++ kernels a saved graph needs, saved with it, so a new process loading it builds none.

A graph saved by torch._inductor's standalone_compile holds its output code, whose kernels are C++
sources compiled when the code is first loaded: in a new process, each is built again in the
graph's folder (~22 s of g++ for the default model's twelve graphs on a 2-core EPYC). The compile
has just built the same sources in Inductor's own cache, named by the source's hash: recorded
while compiling and copied beside the saved graph, a new process finds each library already built.

Where that fails (a kernel not recorded, a file gone), compiled_layers falls back to loading the
saved graphs once in a background process, which builds what is missing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pathlib
import shutil
from typing import Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def recording_kernel_sources() -> Iterator[list[pathlib.Path]]:
    """The C++ sources Inductor writes (or finds written) in its cache while the block runs."""
    from torch._inductor import codecache

    sources: list[pathlib.Path] = []
    write = codecache.write

    def recording_write(content, extension, *args, **kwargs):
        basename, path = write(content, extension, *args, **kwargs)
        if extension.endswith("cpp"):
            sources.append(pathlib.Path(path))
        return basename, path

    codecache.write = recording_write
    try:
        yield sources
    finally:
        codecache.write = write


def copy_kernels(sources: list[pathlib.Path], artifact_dir: pathlib.Path) -> bool:
    """Copy each source and what was built from it (its files share the hash before the first dot)
    into artifact_dir at the same place relative to Inductor's cache -> whether every source came
    with its library."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = pathlib.Path(cache_dir())
    complete = True
    for source in sources:
        try:
            rel_dir = source.parent.relative_to(root)
        except ValueError:  # written outside the cache (a folder of the user's choosing)
            complete = False
            continue
        stem = source.name.split(".", 1)[0]
        built = [p for p in source.parent.glob(stem + ".*") if p.is_file()]
        complete &= any(p.suffix == ".so" for p in built)
        (artifact_dir / rel_dir).mkdir(parents=True, exist_ok=True)
        for p in built:
            target = artifact_dir / rel_dir / p.name
            if not target.exists():
                shutil.copy2(p, target)
    return complete


@functools.cache
def pinned_vector_isa() -> str:
    """Inductor's CPU vector ISA for this process, probed once and pinned -> its name and width, for
    the keys of the graphs radixrt saves.

    Inductor picks the ISA per process (ATEN_CPU_CAPABILITY, else a probe that builds a small
    kernel per ISA and has a child process load it, 60 s allowed), and the key of its own graph
    cache does not say which ISA the code was generated for. A process that picked AVX2 on an
    AVX-512 machine (an emulated AVX2 run; a probe timed out under load) leaves 8-wide loops in the
    shared cache, and a process that picked AVX-512 loads them and builds them 16 wide, so each
    vector store writes 32 bytes past its buffer (CI's abort in test_step_graph, after an emulated
    run on the same machine). Pinning cpp.simdlen puts the width into Inductor's cache key, and
    graph_key puts it into ours: code generated for one width is never built for another.

    The probe runs while the cache is Inductor's own: otherwise the first graph a process loads runs
    it with the cache pointed at that graph's folder and builds the probes there again (~10 s)."""
    from torch._inductor import config, cpu_vec_isa

    try:
        isa = cpu_vec_isa.pick_vec_isa()
    except Exception as e:  # no compiler: Inductor reports it on the compile that follows
        log.debug("Inductor's ISA probe: %s: %s", type(e).__name__, e)
        return "unprobed"
    if isa:  # an invalid ISA (no vector code) is falsy and has no width to pin
        config.cpp.simdlen = isa.bit_width()
    return f"{isa}-{isa.bit_width()}"
