"""Triton kernels on the CPU through the interpreter.

triton.jit decides interpreted-or-compiled when a kernel is *decorated*, so the variable must
be set before radixrt.kernels.triton_* is imported. If some earlier-collected module already
imported them compiled (no CUDA here, so they could never run), reload them interpreted.
On a CUDA machine this tier is skipped instead: tests/gpu runs the compiled kernels there, and
switching the whole session to the interpreter would turn those into interpreter runs.
"""

import importlib
import os
import pathlib
import sys

import pytest
import torch

_HERE = pathlib.Path(__file__).parent
_ON_CUDA = torch.cuda.is_available()

if not _ON_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
    for _name in (
        "radixrt.kernels.triton_decode",
        "radixrt.kernels.triton_extend",
        "radixrt.kernels.attention_triton",
        "radixrt.kernels.lora_triton",
        "radixrt.kernels.moe_triton",
    ):
        if _name in sys.modules:
            importlib.reload(sys.modules[_name])


def pytest_collection_modifyitems(config, items):
    if not _ON_CUDA:
        return
    skip = pytest.mark.skip(
        reason="interpreter tier runs on CPU-only machines; tests/gpu covers CUDA"
    )
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(skip)
