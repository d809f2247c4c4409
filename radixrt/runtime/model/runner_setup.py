"""What the model runner is built from: its device, attention backend, EOS ids and KV pool size."""

from __future__ import annotations

import os
from typing import Any

import torch

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.model.dtype_choice import cpu_flags

DEFAULT_MAX_TOTAL_TOKENS = 32768
CPU_HEADROOM_BYTES = 1 << 30


def pick_device(config: ServerConfig) -> torch.device:
    if config.device != "auto":
        return torch.device(config.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_attention_backend(
    name: str | None,
    device: torch.device,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    deterministic: bool = False,
):
    """deterministic: the batch-invariant torch backend (--enable-deterministic-inference)."""
    name = name or ("triton" if device.type == "cuda" else "torch")
    if deterministic:
        from radixrt.kernels.attention_deterministic import DeterministicAttentionBackend

        return DeterministicAttentionBackend(num_q_heads, num_kv_heads, head_dim)
    if name == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1 for tests)"
            )
        from radixrt.kernels.attention_triton import TritonAttentionBackend

        return TritonAttentionBackend(num_q_heads, num_kv_heads, head_dim)
    from radixrt.kernels.attention_torch import TorchAttentionBackend

    # prompts attend in bf16 only where that is faster: with AMX, oneDNN's bf16 flash kernel takes 8
    # ms a layer at 2,048 tokens against 20 in float32; with avx512_bf16 alone it is no faster (3.44
    # s vs 3.33 s for the 2,048-token prefill on a 2-core EPYC), and float32 keeps 0.17 points of
    # agreement (attention_torch.py)
    return TorchAttentionBackend(
        num_q_heads, num_kv_heads, head_dim, prompt_fp32="amx_bf16" not in cpu_flags()
    )


def eos_token_ids(hf_config, model_dir, tokenizer) -> list[int]:
    ids: set[int] = set()
    for src in (hf_config, _generation_config(model_dir)):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def _generation_config(model_dir):
    try:
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError):
        return None


def available_memory_bytes(device: torch.device) -> int:
    """Memory free for the KV pool now: free device memory on CUDA; on a CPU the kernel's
    MemAvailable less CPU_HEADROOM_BYTES (activations, the tokenizer, the grammar workers)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            avail = next(
                int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")
            )
    except (OSError, StopIteration, ValueError):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(0, avail - CPU_HEADROOM_BYTES)


def pool_tokens(config: Any, bytes_per_token: int, device: torch.device) -> int:
    """--max-total-tokens when given; else --mem-fraction-static of the free memory; else the
    default."""
    if config.max_total_tokens:
        return config.max_total_tokens
    if config.mem_fraction_static is not None:
        tokens = int(available_memory_bytes(device) * config.mem_fraction_static) // bytes_per_token
        if tokens < config.page_size:
            raise ValueError(
                f"mem_fraction_static {config.mem_fraction_static} leaves room for "
                f"{tokens} KV tokens"
            )
        return tokens
    return DEFAULT_MAX_TOTAL_TOKENS


def setup_device(config: ServerConfig, tp_rank: int) -> torch.device:
    """The runner's device, and the threads torch uses on it."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    elif config.tp_size > 1:  # this node's ranks share its cores instead of each taking them all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (config.tp_size // config.nnodes)))
    device = pick_device(config)
    if config.tp_size > 1 and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", tp_rank % torch.cuda.device_count())  # NCCL: one per rank
    if device.type == "cuda":
        torch.cuda.set_device(device)  # Triton launches on the current device
        capability = torch.cuda.get_device_capability(device)
        if config.kv_cache_dtype == "fp8_e4m3" and capability < (8, 9):
            raise ValueError(
                "--kv-cache-dtype fp8_e4m3 needs a GPU with fp8 (compute capability 8.9+); use int8"
            )
    return device
