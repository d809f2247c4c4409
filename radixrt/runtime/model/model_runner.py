"""plan -> tensors -> forward -> logits -> sampled tokens. Owns the model and the KV tensors."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import torch

from radixrt.kernels.kv_quant import KV_CACHE_DTYPES
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.plan import ItemResult, PlanItem, PlanItemError
from radixrt.runtime.model import compiled_layers, int4_weight, kv_tier, tp
from radixrt.runtime.model.dtype_choice import cpu_flags, pick_dtype
from radixrt.runtime.model.forward_batch import BatchItem, build_forward_batch
from radixrt.runtime.model.kv_cache import KVCache, ReqToSlotTable
from radixrt.runtime.model.sampler import NoAllowedTokenError, sample
from radixrt.runtime.model.tp_shard import plan_shard, shard_state_dict
from radixrt.runtime.model.weights import cache_root

log = logging.getLogger(__name__)

DEFAULT_MAX_TOTAL_TOKENS = 32768
CPU_HEADROOM_BYTES = 1 << 30


def pick_device(config: ServerConfig) -> torch.device:
    if config.device != "auto":
        return torch.device(config.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_attention_backend(
    name: str | None, device: torch.device, num_q_heads: int, num_kv_heads: int, head_dim: int
):
    name = name or ("triton" if device.type == "cuda" else "torch")
    if name == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1 for tests)"
            )
        from radixrt.kernels.attention_triton import TritonAttentionBackend

        return TritonAttentionBackend(num_q_heads, num_kv_heads, head_dim)
    from radixrt.kernels.attention_torch import TorchAttentionBackend

    # prompts attend in bf16 only where that is faster: with AMX, oneDNN's bf16 flash kernel takes 8 ms a layer
    # at 2,048 tokens against 20 in float32; with avx512_bf16 alone it is no faster (3.44 s vs 3.33 s for the
    # 2,048-token prefill on a 2-core EPYC), and float32 keeps 0.17 points of agreement (attention_torch.py)
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
    """Memory free for the KV pool now: free device memory on CUDA; on a CPU the kernel's MemAvailable less
    CPU_HEADROOM_BYTES (activations, the tokenizer, the grammar workers)."""
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
    """--max-total-tokens when given; else --mem-fraction-static of the free memory; else the default."""
    if config.max_total_tokens:
        return config.max_total_tokens
    if config.mem_fraction_static is not None:
        tokens = int(available_memory_bytes(device) * config.mem_fraction_static) // bytes_per_token
        if tokens < config.page_size:
            raise ValueError(
                f"mem_fraction_static {config.mem_fraction_static} leaves room for {tokens} KV tokens"
            )
        return tokens
    return DEFAULT_MAX_TOTAL_TOKENS


class ModelRunner:
    def __init__(self, config: ServerConfig, tp_rank: int = 0, init_method: str | None = None):
        """tp_rank/init_method: a tensor parallel worker rank (tp.run_worker); rank 0 (the scheduler's runner)
        starts this node's workers itself."""
        from radixrt.runtime.model.models.llama import LlamaForCausalLM
        from radixrt.runtime.model.weights import (
            load_config,
            load_state_dict,
            load_tokenizer,
            resolve_model,
        )

        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        elif (
            config.tp_size > 1
        ):  # this node's ranks share its cores instead of each taking all of them
            torch.set_num_threads(
                max(1, (os.cpu_count() or 1) // (config.tp_size // config.nnodes))
            )
        self.device = pick_device(config)
        if config.tp_size > 1 and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device(
                "cuda", tp_rank % torch.cuda.device_count()
            )  # NCCL: a device per rank
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # Triton launches on the current device
            if config.kv_cache_dtype == "fp8_e4m3" and torch.cuda.get_device_capability(
                self.device
            ) < (8, 9):
                raise ValueError(
                    "--kv-cache-dtype fp8_e4m3 needs a GPU with fp8 (compute capability 8.9+); "
                    "use int8"
                )
        self.tp, self.tp_workers, self.rank_lost = None, [], None
        self.exit_on_rank_loss = (
            False  # the scheduler process sets it: a lost rank ends the process
        )
        self._stop_watching = None
        if config.tp_size > 1:
            if tp_rank == 0:
                init_method = tp.init_method_of(config)
                self.tp_workers = tp.start_workers(config, init_method)
                self._stop_watching = tp.watch_workers(self.tp_workers, self._on_rank_lost)
            self.tp = tp.TPGroup(
                tp_rank, config.tp_size, init_method, self.device, config.dist_timeout
            )
        self.dtype, dtype_reason = pick_dtype(config.dtype, self.device)
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        log.info("%s", dtype_reason)
        model_dir = resolve_model(config.model_path)
        self.model_path = str(config.model_path or model_dir)
        hf_config = load_config(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        shard = plan_shard(hf_config, tp_rank, config.tp_size) if self.tp is not None else None
        self.model = LlamaForCausalLM(hf_config, self.dtype, self.device, shard, self.tp)
        int4 = (
            config.quantization == "auto"
            and self.dtype == torch.bfloat16
            and self.device.type == "cpu"
            and int4_weight.available()
            and shard is None
        )  # 4-bit groups are not cut along ranks
        # the 4-bit copies are recovered from the unrounded float32 weights
        state = load_state_dict(model_dir, torch.float32 if int4 else self.dtype)
        self.model.load_weights(
            shard_state_dict(state, hf_config, shard) if shard else state, int4=int4
        )
        if int4:
            linears = [
                lin
                for layer in self.model.layers
                for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
            ]
            linears.append(self.model.lm_head.linear)
            log.info(
                "4-bit copies for steps of <= %d rows: %d of %d linear weights are exact 4-bit groups",
                int4_weight.MAX_ROWS,
                sum(lin.int4 is not None for lin in linears),
                len(linears),
            )
        self.vocab_size = self.model.vocab_size
        self.eos_token_ids = eos_token_ids(hf_config, model_dir, self.tokenizer)
        self.context_length = min(
            config.context_length or self.model.max_context, self.model.max_context
        )

        self.page_size = page_size = config.page_size
        # the pool's storage: the model's attention dtype, or int8 / fp8 with scales (--kv-cache-dtype)
        self.kv_dtype = KV_CACHE_DTYPES.get(config.kv_cache_dtype, self.model.attn_dtype)
        self.kv_bytes_per_token = KVCache.bytes_per_token(
            self.model.num_layers, self.model.num_kv_heads, self.model.head_dim, self.kv_dtype
        )
        total_tokens = pool_tokens(config, self.kv_bytes_per_token, self.device)
        self.num_pages = max(total_tokens // page_size, 1)
        if self.tp is not None:  # every rank's pool holds the same pages (of its own KV heads)
            self.num_pages = self.tp.min_int(self.num_pages)
        self.kv_pool_bytes = self.num_pages * page_size * self.kv_bytes_per_token
        self.kv = KVCache(
            self.model.num_layers,
            self.num_pages * page_size,
            self.model.num_kv_heads,
            self.model.head_dim,
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
            self.model.num_q_heads,
            self.model.num_kv_heads,
            self.model.head_dim,
        )
        log.info(
            "model %s: %s on %s, KV pool %d tokens (%d pages of %d, %.1f MiB at %d bytes a token)",
            self.model_path,
            self.dtype,
            self.device,
            self.num_pages * page_size,
            self.num_pages,
            page_size,
            self.kv_pool_bytes / 2**20,
            self.kv_bytes_per_token,
        )
        self.graphs: compiled_layers.CompiledLayers | None = (
            None  # eager until compiled (warm-up uses them)
        )
        self._compile_layers(config)

    def _compile_layers(self, config: ServerConfig) -> None:
        """The layers as compiled graphs (compiled_layers.py), compiled or loaded now; self.graphs stays None
        (eager) when why_eager says so."""
        why_eager = compiled_layers.why_eager(config, self.device, self.tp is not None)
        if why_eager:
            log.info("torch.compile off: %s; the model runs eager", why_eager)
            return
        compiled_layers.use_inductor_cache(str(cache_root()))
        self.graphs = compiled_layers.CompiledLayers(
            self.model.eager_dims, config.torch_compile_max_bs, cache_root() / "compiled"
        )
        self.graphs.warm_up(self._warm_up_forward)

    @torch.inference_mode()
    def _warm_up_forward(self, num_tokens: int) -> None:
        """One forward of num_tokens throwaway tokens (table row 0, pool slots from 0: nothing is cached yet)."""
        slots = [i % (self.num_pages * self.page_size) for i in range(num_tokens)]
        self._forward([BatchItem(0, [0] * num_tokens, 0, slots, 0)], [])

    @torch.inference_mode()
    def run(self, plan: list[PlanItem]) -> list[ItemResult]:
        # a draft item wants logits at every new position, like prompt logprobs from prefix_len on
        items = [
            BatchItem(
                it.row,
                it.new_ids,
                it.prefix_len,
                it.slots,
                it.write_start,
                it.prefix_len if it.num_draft else it.logits_start,
            )
            for it in plan
        ]
        copies = [pair for it in plan for pair in it.page_copies]
        if self.tp is None:
            return self._results(plan, self._forward(items, copies))
        if self.rank_lost:
            raise tp.TPFailure(self.rank_lost)
        self.tp.broadcast_obj(
            {"items": [dataclasses.astuple(it) for it in items], "copies": copies}
        )
        try:
            logits = self._forward(items, copies)
        except tp.TPFailure:
            raise
        except (
            Exception
        ) as e:  # the other ranks are inside this forward's collectives: out of step for good
            raise tp.TPFailure(
                f"rank 0 failed inside a tensor parallel forward: {type(e).__name__}: {e}"
            ) from e
        return self._results(plan, logits)

    def _forward(
        self, items: list[BatchItem], copies: list[tuple[int, int]]
    ) -> torch.Tensor | None:
        """Copy pages (forked samples), then the forward: logits [R, vocab] float32 (None on a worker rank)."""
        self.kv.copy_pages(copies, self.page_size)
        fb = build_forward_batch(items, self.table.table, self.device)
        self.attn.init_forward_metadata(fb)
        return self.model.forward(fb, self.kv, self.attn, self.graphs)

    @torch.inference_mode()
    def serve_worker(self) -> None:
        """A worker rank's loop: run every forward rank 0 broadcasts until it says stop."""
        while (step := self.tp.broadcast_obj()) is not None:
            self._forward(
                [BatchItem(*it) for it in step["items"]], [tuple(c) for c in step["copies"]]
            )
        self.tp.close()

    def _on_rank_lost(self, reason: str) -> None:
        log.error("%s", reason)
        self.rank_lost = reason
        if self.exit_on_rank_loss:  # rank 0 may be waiting in a collective that will never finish
            logging.shutdown()
            os._exit(1)

    def make_kv_tier(self, config: ServerConfig) -> kv_tier.KVTierStore:
        """The second cache tier's storage (--enable-hierarchical-cache), made once, by the scheduler."""
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

    def _results(self, plan: list[PlanItem], logits: torch.Tensor) -> list[ItemResult]:
        results = [ItemResult() for _ in plan]
        pick_rows: list[int] = []  # logits rows to sample
        picks: list[
            tuple[int, int]
        ] = []  # (plan index, position after the last fed token: 0, or j after draft j)
        row = 0
        for i, it in enumerate(plan):
            end = it.prefix_len + len(it.new_ids)  # positions prefix_len..end-1 were fed
            if it.num_draft:
                first_pick = row + len(it.new_ids) - 1 - it.num_draft
                pick_rows.extend(range(first_pick, first_pick + len(it.picks)))
                picks.extend((i, j) for j in range(len(it.picks)))
                row += len(it.new_ids)
                continue
            if it.logits_start is not None:
                first = min(max(it.logits_start, it.prefix_len), end - 1)
                results[i].prompt_logprobs, results[i].prompt_top_logprobs = self._prompt_logprobs(
                    it, logits[row : row + end - first], first
                )
                row += end - first
            else:
                row += 1
            if it.picks:
                pick_rows.append(row - 1)
                picks.append((i, 0))
        if not picks:
            return results
        rows = [plan[i].picks[j] for i, j in picks]
        mask = None
        if any(r.mask_source is not None for r in rows):
            from radixrt.runtime.constrained import fill_masks

            mask = fill_masks([r.mask_source for r in rows], self.vocab_size, self.device)
        last = logits if len(pick_rows) == logits.shape[0] else logits[pick_rows]
        try:
            out = sample(last, rows, mask)
        except NoAllowedTokenError as e:  # only the requests of those rows fail, as bad requests
            blocked = any(rows[k].blocked_ids for k in e.rows)
            why = (
                "its constraint allows only its end here and min_new_tokens (or a stop token id it may not reach "
                "before the minimum) forbids ending"
                if blocked
                else "its constraint allows no token here"
            )
            raise PlanItemError(
                sorted({picks[k][0] for k in e.rows}),
                "no token satisfies the request's constraint "
                f"and sampling parameters together: {why}",
                status=400,
            ) from None
        for k, (i, j) in enumerate(picks):
            res = results[i] if j == 0 else ItemResult()
            res.next_id = out.next_ids[k]
            if out.logprobs is not None:
                res.logprob = out.logprobs[k]
            if out.top_logprobs is not None:
                res.top_logprobs = out.top_logprobs[k]
            if j:
                if results[i].draft_results is None:
                    results[i].draft_results = []
                results[i].draft_results.append(res)
        return results

    @staticmethod
    def _prompt_logprobs(it: PlanItem, logits: torch.Tensor, first: int):
        """Logprobs of the prompt tokens that follow positions first..end-1 (rows of `logits`)."""
        prompt = it.prompt_ids
        positions = [
            q
            for q in range(first, first + logits.shape[0])
            if q >= it.logits_start and q + 1 < len(prompt)
        ]
        if not positions:
            return None, None
        lp = torch.log_softmax(
            logits[positions[0] - first : positions[-1] - first + 1].float(), dim=-1
        )
        targets = torch.tensor([prompt[q + 1] for q in positions], device=lp.device)
        chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
        logprobs = [(c, prompt[q + 1]) for c, q in zip(chosen, positions)]
        tops = None
        if it.top_logprobs_num > 0:
            vals, ids = lp.topk(it.top_logprobs_num, dim=-1)
            tops = [list(zip(v, t)) for v, t in zip(vals.tolist(), ids.tolist())]
        return logprobs, tops
