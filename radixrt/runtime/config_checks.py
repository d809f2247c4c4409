"""ServerConfig's checks: each refuses an out-of-range or contradictory setting, naming it. Run in
order by ServerConfig.__post_init__ (the first one found is named)."""

from __future__ import annotations

from typing import Any

# the projections a LoRA adapter may target (model/lora_adapter.py), in a Llama-family layer
PD_SECRET_ENV = "RADIXRT_DISAGGREGATION_SECRET"
# `radixrt serve` takes each of these keys from its variable when the flag is unset, and a launcher
# hands them to the servers it starts that way: argv is readable by every local user (/proc)
SECRET_ENVS = {
    "api_key": "RADIXRT_API_KEY",
    "admin_api_key": "RADIXRT_ADMIN_API_KEY",
    "disaggregation_secret": PD_SECRET_ENV,
    "disaggregation_channel_secret": "RADIXRT_DISAGGREGATION_CHANNEL_SECRET",
}
MIN_PD_SECRET_CHARS = 16  # the channel keys derive from it: a short one is a guessable key
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_sizes(c: Any) -> None:
    """The KV pool's and a batch's sizes, and the JSON-schema depth bound."""
    if c.page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {c.page_size}")
    if c.chunked_prefill_size < c.page_size:
        raise ValueError("chunked_prefill_size must be >= page_size")
    if c.mem_fraction_static is not None and not 0 < c.mem_fraction_static < 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {c.mem_fraction_static}")
    if c.max_total_tokens is not None and c.max_total_tokens < c.page_size:
        raise ValueError(f"max_total_tokens must be >= page_size, got {c.max_total_tokens}")
    if c.max_running_requests < 1 or c.max_queued_requests < 1:
        raise ValueError("max_running_requests and max_queued_requests must be >= 1")
    if c.max_requests_per_client is not None and c.max_requests_per_client < 1:
        raise ValueError(f"max_requests_per_client must be >= 1, got {c.max_requests_per_client}")
    if c.request_timeout is not None and c.request_timeout < 0:
        raise ValueError(f"request_timeout must be >= 0 (0: no limit), got {c.request_timeout}")
    if not 1 <= c.json_object_max_depth <= 64:
        raise ValueError(f"json_object_max_depth must be in [1, 64], got {c.json_object_max_depth}")


def check_parallelism(c: Any) -> None:
    """Data and tensor parallelism, across nodes."""
    if c.dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {c.dp_size}")
    if c.tp_size < 1 or c.nnodes < 1 or c.tp_size % c.nnodes:
        raise ValueError(
            f"tp_size ({c.tp_size}) must be a positive multiple of nnodes ({c.nnodes})"
        )
    if not 0 <= c.node_rank < c.nnodes:
        raise ValueError(f"node_rank must be in [0, nnodes), got {c.node_rank}")
    if c.nnodes > 1 and not c.dist_init_addr:
        raise ValueError("--nnodes > 1 needs --dist-init-addr host:port (node 0's address)")


def check_compile_and_speculation(c: Any) -> None:
    """torch.compile's flags and speculative decoding's draft length."""
    if c.torch_compile_max_bs < 2:
        raise ValueError(f"torch_compile_max_bs must be >= 2, got {c.torch_compile_max_bs}")
    if c.enable_torch_compile and c.disable_torch_compile:
        raise ValueError("--enable-torch-compile and --disable-torch-compile contradict each other")
    if c.enable_deterministic_inference and (c.attention_backend == "triton" or c.lora_enabled):
        raise ValueError(
            "--enable-deterministic-inference covers the torch attention backend without LoRA "
            "adapters (docs/deterministic-inference.md)"
        )
    if not 1 <= c.speculative_num_draft_tokens <= 64:
        raise ValueError(
            f"speculative_num_draft_tokens must be in [1, 64], got {c.speculative_num_draft_tokens}"
        )


def check_hierarchical_cache(c: Any) -> None:
    """The host-memory tier behind the radix cache."""
    if c.enable_hierarchical_cache and (c.disable_radix_cache or c.tp_size > 1):
        raise ValueError("--enable-hierarchical-cache needs the radix cache and --tp-size 1")
    if c.hicache_ratio <= 0 or c.hicache_size < 0:
        raise ValueError(
            f"hicache_ratio must be > 0 and hicache_size >= 0, got {c.hicache_ratio}, "
            f"{c.hicache_size}"
        )


def check_choices(c: Any) -> None:
    """Each field with a fixed set of values holds one of them (None: unset)."""
    for name in (
        "dtype",
        "attention_backend",
        "schedule_policy",
        "log_level",
        "speculative_algorithm",
        "quantization",
        "grammar_backend",
        "router_policy",
        "router_backend",
        "kv_cache_dtype",
        "hicache_write_policy",
        "hicache_storage_backend",
        "disaggregation_mode",
        "disaggregation_transfer_backend",
        "pd",
        "tool_call_parser",
    ):
        choices = c.__dataclass_fields__[name].metadata["choices"]
        value = getattr(c, name)
        if value is not None and choices and value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_lora(c: Any) -> None:
    """LoRA's slots, rank and targets; adapters are served on one rank only."""
    if c.max_loras_per_batch < 1:
        raise ValueError(f"max_loras_per_batch must be >= 1, got {c.max_loras_per_batch}")
    if c.max_lora_rank is not None and not 1 <= c.max_lora_rank <= 1024:
        raise ValueError(f"max_lora_rank must be in [1, 1024], got {c.max_lora_rank}")
    bad = [t for t in c.lora_target_modules or () if t not in LORA_TARGETS]
    if bad:
        raise ValueError(f"lora_target_modules: {bad[0]!r} is not one of {', '.join(LORA_TARGETS)}")
    if c.max_loaded_loras < c.max_loras_per_batch:
        raise ValueError(
            f"max_loaded_loras ({c.max_loaded_loras}) must be >= max_loras_per_batch "
            f"({c.max_loras_per_batch})"
        )
    if len(c.lora_paths or ()) > c.max_loaded_loras:
        raise ValueError(
            f"lora_paths names {len(c.lora_paths)} adapters, above max_loaded_loras "
            f"{c.max_loaded_loras}"
        )
    if c.lora_enabled and c.tp_size > 1:
        raise ValueError(
            "LoRA adapters (--lora-paths, --lora-dir, --max-lora-rank) need --tp-size 1"
        )


def check_disaggregation(c: Any) -> None:
    """Prefill-decode disaggregation runs one scheduler per server: no tensor or data parallelism
    inside a prefill or decode server (their KV pools would be split across ranks)."""
    if c.disaggregation_mode == "null" and c.pd is None:
        return
    if c.tp_size > 1 or c.dp_size > 1:
        raise ValueError("--disaggregation-mode and --pd need --tp-size 1 and --dp-size 1")
    if c.pd is not None and c.disaggregation_mode != "null":
        raise ValueError("--pd starts both servers itself: leave --disaggregation-mode out")
    if not 0 < c.disaggregation_bootstrap_port < 65536:
        raise ValueError(
            f"disaggregation_bootstrap_port must be in [1, 65535], got "
            f"{c.disaggregation_bootstrap_port}"
        )
    if c.disaggregation_transfer_timeout <= 0:
        raise ValueError(
            f"disaggregation_transfer_timeout must be > 0, got {c.disaggregation_transfer_timeout}"
        )
    check_pd_trust(c)


def check_pd_trust(c: Any) -> None:
    """A prefill-decode pair authenticates each other and the router by one secret, and a decode
    server takes KV only from prefill servers its operator named (docs/security.md)."""
    if c.disaggregation_transfer_backend == "mooncake":
        raise ValueError(
            "--disaggregation-transfer-backend mooncake is refused: Mooncake's TCP transport "
            "serves reads and writes at any address of the process to any peer; use zmq (the "
            "default: ZeroMQ with CURVE authentication, the bytes going only into the room's pages)"
        )
    if c.pd is not None:
        if c.api_key is None or len(c.api_key) < MIN_PD_SECRET_CHARS:
            raise ValueError(
                f"--pd 1p1d needs --api-key of at least {MIN_PD_SECRET_CHARS} characters: "
                "sglang-router presents its key to the servers, which take bootstrap fields only "
                "with the pair's secret (that key)"
            )
        return
    if not c.disaggregation_secret or len(c.disaggregation_secret) < MIN_PD_SECRET_CHARS:
        raise ValueError(
            f"--disaggregation-mode {c.disaggregation_mode} needs --disaggregation-secret (or "
            f"$RADIXRT_DISAGGREGATION_SECRET) of at least {MIN_PD_SECRET_CHARS} characters, the "
            "same on both servers and as the router's --api-key"
        )
    channel = c.disaggregation_channel_secret
    if not channel or len(channel) < MIN_PD_SECRET_CHARS:
        raise ValueError(
            f"--disaggregation-mode {c.disaggregation_mode} needs --disaggregation-channel-secret "
            f"(or $RADIXRT_DISAGGREGATION_CHANNEL_SECRET) of at least {MIN_PD_SECRET_CHARS} "
            "characters, the same on both servers and known to nothing else: the transfer "
            "channel's keys derive from it"
        )
    if channel in (c.disaggregation_secret, c.api_key, c.admin_api_key):
        raise ValueError(
            "disaggregation_channel_secret must differ from --disaggregation-secret and the API "
            "keys: the router and the clients hold those, and would hold the channel's keys"
        )
    if c.disaggregation_mode == "decode" and not c.disaggregation_prefill_addrs:
        raise ValueError(
            "--disaggregation-mode decode needs --disaggregation-prefill-addrs: the prefill "
            "servers (host:port of their bootstrap ports) it may take KV from"
        )
    for addr in c.prefill_bootstrap_addrs:
        host, _, port = addr.rpartition(":")
        if not host or not 0 < int(port) < 65536:
            raise ValueError(f"disaggregation_prefill_addrs: {addr!r} is not host:port")


def check_keys(c: Any) -> None:
    """The admin key must differ from the API key: one key for both makes every client an admin."""
    if c.admin_api_key is not None and c.admin_api_key == c.api_key:
        raise ValueError("admin_api_key must differ from api_key (or every client is an admin)")


CHECKS = (
    check_keys,
    check_sizes,
    check_parallelism,
    check_compile_and_speculation,
    check_hierarchical_cache,
    check_lora,
    check_choices,
    check_disaggregation,
)
