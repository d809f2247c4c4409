"""Which dtype `auto` means on this machine, and why (the start-up log says it).

bfloat16 where the hardware multiplies it natively: CUDA, and CPUs with avx512_bf16 or AMX
(oneDNN then runs bf16 GEMMs at ~2x float32's rate, and weights/KV take half the memory).
float32 elsewhere: without native bf16 the CPU converts every operand and bf16 is slower.
"""

from __future__ import annotations

import pathlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def pick_dtype(
    requested: str, device: torch.device, flags: set[str] | None = None
) -> tuple[torch.dtype, str]:
    """(dtype, the reason in words)."""
    if requested != "auto":
        return DTYPES[requested], f"dtype {requested} requested"
    if device.type == "cuda":
        return torch.bfloat16, "dtype auto: bfloat16 on CUDA"
    flags = cpu_flags() if flags is None else flags
    native = [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]
    if native:
        return (
            torch.bfloat16,
            f"dtype auto: bfloat16, the CPU multiplies it natively ({', '.join(native)})",
        )
    return torch.float32, (
        "dtype auto: float32, the CPU has no native bfloat16 "
        f"(none of {', '.join(NATIVE_BF16_CPU_FLAGS)})"
    )
