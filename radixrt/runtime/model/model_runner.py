"""plan -> tensors -> forward -> logits -> sampled tokens. Owns the model and the KV tensors.

LONG_FILE: one concept, the ModelRunner (core's plan.Runner): its set-up steps already live in
runner_setup.py, what remains is the runner's own state and the step it runs.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import torch

from radixrt.kernels.kv_quant import KV_CACHE_DTYPES
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.plan import ItemResult, PlanItem, decode_forward, encode_forward
from radixrt.runtime.model import (
    compiled_layers,
    deterministic,
    kv_tier,
    linear,
    step_graph,
    tp,
    weight_plan,
)
from radixrt.runtime.model.dtype_choice import pick_dtype
from radixrt.runtime.model.forward_batch import ForwardBatch, build_forward_batch
from radixrt.runtime.model.kv_cache import KVCache, ReqToSlotTable
from radixrt.runtime.model.lora_registry import LoraRegistry
from radixrt.runtime.model.runner_setup import (
    available_memory_bytes,
    eos_token_ids,
    make_attention_backend,
    pool_tokens,
    setup_device,
)
from radixrt.runtime.model.step_results import MaskFiller, step_results
from radixrt.runtime.model.tp_shard import plan_shard, shard_state_dict
from radixrt.runtime.model.weights import cache_root

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        config: ServerConfig,
        tp_rank: int = 0,
        init_method: str | None = None,
        fill_masks: MaskFiller | None = None,
    ):
        """tp_rank/init_method: a tensor parallel worker rank (tp_worker.run_worker); rank 0 (the
        scheduler's runner) starts this node's workers itself. fill_masks: turns the plan's mask
        sources into the allowed-token mask (constrained/state.py's; handed in: model/ never imports
        grammars)."""
        self.fill_masks = fill_masks
        # before anything asks Inductor for its cache dir, which fixes it for the process
        compiled_layers.use_inductor_cache(str(cache_root()))
        self.device = setup_device(config, tp_rank)
        self.exit_on_rank_loss = False  # the scheduler process sets it: a lost rank ends it
        self._start_tp(config, tp_rank, init_method)
        self.dtype, dtype_reason = pick_dtype(config.dtype, self.device)
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        log.info("%s", dtype_reason)
        self._load_model(config)
        self.lora = LoraRegistry(config, self.model, self.device) if config.lora_enabled else None
        self.page_size = config.page_size
        self._make_pool(config)
        self.graphs: compiled_layers.CompiledLayers | None = None  # eager until compiled
        self.step_graphs: step_graph.StepGraphs | None = None  # decode steps as one graph
        self.weight_plan_info: dict | None = None  # weight_plan.apply's account, when it plans
        why_not = deterministic.why_not_invariant_prompts(config, self.model, self.device, self.tp)
        self.invariant_prompts = why_not is None
        self.prompt_attn = None  # warm-up forwards (compiling) run as any step
        self._compile_layers(config)
        # the backend of steps that compute prompt KV (None: they run as every other step)
        self.prompt_attn = deterministic.prompt_backend(self.model, self.dtype, why_not)

    def _start_tp(self, config: ServerConfig, tp_rank: int, init_method: str | None) -> None:
        self.tp, self.tp_workers, self.rank_lost, self._stop_watching = None, [], None, None
        if config.tp_size > 1:
            if tp_rank == 0:
                init_method = tp.init_method_of(config)
                self.tp_workers = tp.start_workers(config, init_method)
                self._stop_watching = tp.watch_workers(self.tp_workers, self._on_rank_lost)
            self.tp = tp.TPGroup(
                tp_rank, config.tp_size, init_method, self.device, config.dist_timeout
            )

    def _load_model(self, config: ServerConfig) -> None:
        """The weights (this rank's shard; integer forms where they apply), tokenizer, EOS ids."""
        from radixrt.runtime.model import gguf_weights
        from radixrt.runtime.model.models.registry import model_class
        from radixrt.runtime.model.weights import (
            load_config,
            load_state_dict,
            load_tokenizer,
            resolve_model,
        )

        model_dir = resolve_model(config.model_path)
        self.model_path = str(config.model_path or model_dir)
        hf_config = load_config(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        shard = plan_shard(hf_config, self.tp.rank, config.tp_size) if self.tp else None
        cls = model_class(hf_config)
        if shard is not None and not cls.supports_tp:
            raise ValueError(
                f"{cls.__name__}: tensor parallelism is not supported yet (--tp-size 1)"
            )
        self.model = cls(hf_config, self.dtype, self.device, shard, self.tp)
        quantized = gguf_weights.is_quantized_dir(model_dir) and any(
            t not in ("F32", "F16", "BF16") for t in gguf_weights.quantization_types(model_dir)
        )
        self.deterministic = config.enable_deterministic_inference
        self.int_copies = (
            not self.deterministic
            and self.model.supports_int_copies
            and weight_plan.wants_copies(config.quantization, quantized, self.device, config.dtype)
            and shard is None  # 4-bit groups are not cut along ranks
        )
        # the integer forms are built from the unrounded float32 weights
        state = load_state_dict(model_dir, torch.float32 if self.int_copies else self.dtype)
        if shard:
            state = shard_state_dict(self.model.standard_names(state), hf_config, shard)
        self.model.load_weights(state, copies=self.int_copies)
        if self.deterministic:
            deterministic.apply(self.model, self.dtype)
            log.info("deterministic inference: batch-invariant matmuls (checked) and attention")
        if gguf_weights.is_quantized_dir(model_dir):
            log.info(
                "GGUF tensors %s, dequantised into %s at load",
                gguf_weights.quantization_types(model_dir),
                self.dtype,
            )
        self.vocab_size = self.model.vocab_size
        self.eos_token_ids = eos_token_ids(hf_config, model_dir, self.tokenizer)
        max_context = self.model.max_context
        self.context_length = min(config.context_length or max_context, max_context)

    def _make_pool(self, config: ServerConfig) -> None:
        """The KV pool, the req->slot table and the attention backend."""
        page_size, model = self.page_size, self.model
        # the pool's storage: the model's attention dtype, or int8 / fp8 with scales
        self.kv_dtype = KV_CACHE_DTYPES.get(config.kv_cache_dtype, model.attn_dtype)
        self.kv_cache_dtype = str(self.kv_dtype).removeprefix("torch.")
        self.kv_bytes_per_token = KVCache.bytes_per_token(
            model.num_layers, model.num_kv_heads, model.head_dim, self.kv_dtype
        )
        total_tokens = pool_tokens(config, self.kv_bytes_per_token, self.device)
        self.num_pages = max(total_tokens // page_size, 1)
        if self.tp is not None:  # every rank's pool holds the same pages (of its own KV heads)
            self.num_pages = self.tp.min_int(self.num_pages)
        self.kv_pool_bytes = self.num_pages * page_size * self.kv_bytes_per_token
        num_slots = self.num_pages * page_size
        self.kv = KVCache(
            model.num_layers,
            num_slots,
            model.num_kv_heads,
            model.head_dim,
            self.kv_dtype,
            self.device,
        )
        # one spare row: a request being admitted while max_running_requests run
        self.max_rows = config.max_running_requests + 1
        self.kv_tier: kv_tier.KVTierStore | None = None
        self.table = ReqToSlotTable(self.max_rows, self.context_length + 1, self.device)
        self.attn = make_attention_backend(
            config.attention_backend,
            self.device,
            model.num_q_heads,
            model.num_kv_heads,
            model.head_dim,
            self.deterministic,
        )
        log.info(
            "model %s: %s on %s, KV pool %d tokens (%d pages of %d, %.1f MiB at %d bytes a token)",
            self.model_path,
            self.dtype,
            self.device,
            num_slots,
            self.num_pages,
            page_size,
            self.kv_pool_bytes / 2**20,
            self.kv_bytes_per_token,
        )

    def _compile_layers(self, config: ServerConfig) -> None:
        """The layers as compiled graphs (compiled_layers.py), compiled or loaded now; self.graphs
        stays None (eager) when why_eager says so."""
        why_eager = compiled_layers.why_eager(config, self.device, self.tp is not None)
        if not why_eager and not self.model.compilable:
            why_eager = f"{type(self.model).__name__} runs its layers eager"
        plan = linear.DENSE_ONLY
        if self.int_copies:
            buckets = [
                (b.min_tokens, b.max_tokens)
                for b in compiled_layers.buckets(config.torch_compile_max_bs)
            ]
            plan, self.weight_plan_info = weight_plan.apply(
                self.model,
                config.quantization,
                buckets,
                not why_eager,
                self.dtype,
                cache_root(),
                keep_dense=self.invariant_prompts,
            )
        if why_eager:
            log.info("torch.compile off: %s; the model runs eager", why_eager)
            return
        self.graphs = compiled_layers.CompiledLayers(
            self.model.eager_dims, config.torch_compile_max_bs, cache_root() / "compiled", plan
        )
        why_not = step_graph.why_not(self.model, self.kv, self.attn)
        if why_not is None:
            self.step_graphs = step_graph.StepGraphs(self.graphs, self.model, self.kv)
            self.step_graphs.warm_up()
        else:
            log.info("decode steps run the layer graphs, not one graph: %s", why_not)
        self.graphs.warm_up(self._warm_up_forward)

    @torch.inference_mode()
    def _warm_up_forward(self, num_tokens: int) -> None:
        """One forward of num_tokens throwaway tokens (table row 0, pool slots from 0: nothing is
        cached yet)."""
        slots = [i % (self.num_pages * self.page_size) for i in range(num_tokens)]
        self._forward(
            [PlanItem(row=0, new_ids=[0] * num_tokens, computed_len=0, slots=slots, write_start=0)]
        )

    @torch.inference_mode()
    def run(self, plan: list[PlanItem], mask_sources: Sequence[Any] = ()) -> list[ItemResult]:
        if self.tp is None:
            logits = self._forward(plan)
        else:
            logits = self._tp_forward(plan)
        return step_results(plan, logits, mask_sources, self.fill_masks, self.vocab_size)

    def _tp_forward(self, plan: list[PlanItem]) -> torch.Tensor:
        """Rank 0: send the forward's part of the plan to the other ranks, then run it with them."""
        if self.rank_lost:
            raise tp.TPFailure(self.rank_lost)
        self.tp.broadcast_bytes(encode_forward(plan))
        try:
            return self._forward(plan)
        except tp.TPFailure:
            raise
        except Exception as e:  # the other ranks are inside this forward's collectives: out of step
            raise tp.TPFailure(
                f"rank 0 failed inside a tensor parallel forward: {type(e).__name__}: {e}"
            ) from e

    def _forward(self, plan: list[PlanItem]) -> torch.Tensor | None:
        """Copy pages (forked samples), then the forward: logits [R, vocab] float32 (None on a
        worker rank)."""
        self.kv.copy_pages([pair for it in plan for pair in it.page_copies], self.page_size)
        fb = build_forward_batch(plan, self.table.table, self.device)
        if self.prompt_attn is not None and deterministic.computes_prompt(plan):
            # the cache-invariant prefill: this step's prompt KV the same bits in any batch
            self.prompt_attn.init_forward_metadata(fb)
            with linear.invariant_rows():
                return self.model.forward(fb, self.kv, self.prompt_attn)
        self.attn.init_forward_metadata(fb)
        lora = self.lora.step(plan) if self.lora is not None else None
        return self.forward(fb, lora)

    def forward(self, fb: ForwardBatch, lora: Any = None) -> torch.Tensor | None:
        """The model on a forward batch whose attention is planned: a decode batch as the whole-step
        graph, any other step layer by layer (compiled or eager)."""
        if lora is None and self.step_graphs is not None and self.step_graphs.takes(fb):
            return self.model.head(self.step_graphs.run(fb), fb)
        return self.model.forward(fb, self.kv, self.attn, self.graphs, lora)

    def lora_names(self) -> list[str]:
        return [] if self.lora is None else sorted(self.lora.adapters)

    def read_lora(self, name: str, path: str) -> Any:
        if self.lora is None:
            raise ValueError(
                "this server serves no LoRA adapters (start it with --lora-dir, "
                "--lora-paths or --max-lora-rank)"
            )
        return self.lora.read(name, path)

    def install_lora(self, adapter: Any) -> None:
        self.lora.install(adapter)

    def unload_lora(self, name: str) -> None:
        if self.lora is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded")
        self.lora.unload(name)

    @torch.inference_mode()
    def serve_worker(self) -> None:
        """A worker rank's loop: run every forward rank 0 broadcasts until it says stop."""
        while (step := self.tp.broadcast_bytes()) is not None:
            self._forward(decode_forward(step))
        self.tp.close()

    def _on_rank_lost(self, reason: str) -> None:
        log.error("%s", reason)
        self.rank_lost = reason
        if self.exit_on_rank_loss:  # rank 0 may be waiting in a collective that will never finish
            logging.shutdown()
            os._exit(1)

    def make_kv_tier(self, config: ServerConfig) -> kv_tier.KVTierStore:
        """The second cache tier's storage (--enable-hierarchical-cache), made once, by the
        scheduler."""
        fingerprint = {
            "model": self.model_path,
            "dtype": str(self.dtype),
            "kv_dtype": str(self.kv_dtype),
            "page_size": self.page_size,
            "layers": self.model.num_layers,
            "kv_heads": self.model.num_kv_heads,
            "head_dim": self.model.head_dim,
        }
        self.kv_tier = kv_tier.open_kv_tier(
            config,
            self.kv,
            self.page_size,
            self.num_pages,
            fingerprint,
            available_memory_bytes(torch.device("cpu")),
        )
        return self.kv_tier

    def close(self) -> None:
        """Stop the tensor parallel workers (rank 0); delete the tier file."""
        if self.kv_tier is not None:
            self.kv_tier.close()
        if self._stop_watching is not None:
            self._stop_watching()
        if self.tp is not None and self.tp.rank == 0:
            tp.stop_workers(None if self.rank_lost else self.tp, self.tp_workers)
            self.tp.close()
            self.tp = None
