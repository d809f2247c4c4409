"""Triton kernels on the CPU through the interpreter.

triton.jit decides interpreted-or-compiled when a kernel is *decorated*, so the variable must
be set before radixrt.kernels.triton_* is imported. If some earlier-collected module already
imported them compiled (no CUDA here, so they could never run), reload them interpreted.
"""
import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

for _name in ("radixrt.kernels.triton_decode", "radixrt.kernels.triton_extend", "radixrt.kernels.attention_triton"):
    if _name in sys.modules:
        importlib.reload(sys.modules[_name])
