"""The engine: owns the model, the KV pool, the page table, the attention backend, the CUDA
graphs and the sampler, and turns one scheduled :class:`Batch` into next tokens.

On CUDA nothing here waits for the GPU: :meth:`Engine.forward_batch` queues the step and returns
a :class:`StepResult` whose tokens are read later, so the scheduler can prepare the next step
meanwhile (overlap scheduling). A decode step's input token is the one the previous step sampled:
it stays on the GPU (``last_token``, one per page-table row) and the CPU holds a placeholder
until the result is read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from .attention import create_attention_backend
from .batch import Batch, ForwardBatch
from .batch_layout import build_forward_batch
from .config import EngineConfig
from .cpu_threads import CpuThreads
from .distributed import fused_all_reduce_norm_wanted, get_tp, local_head_counts, min_over_ranks
from .errors import UserError
from .kernels import flashinfer_kernels
from .kvcache import KVPool, PageTable
from .kvcache.kv_pool import resolve_kv_dtype
from .logits_processor import LogitsProcessor, Logprobs, PromptLogprobs, TokenMasks
from .model_loader import free_memory_bytes, load_model
from .models.native_decode import enable_native_decode
from .models.transformer import enable_flashinfer_ops
from .request import TokenLogprobs
from .sampling import Sampler
from .transfer import to_device

logger = logging.getLogger(__name__)

# A CPU prefill chunk should take seconds, not minutes: on two shared cores (the demo model) a
# 2,048-token chunk took 25-85 s, during which a long prompt's progress stood still, a Stop left
# the CPU busy and running replies stalled; 512-token chunks (llama.cpp's default physical batch)
# took 9-14 s there, and a 4,096-token prompt took as long in either (55-122 s against 54-82 s).
DEFAULT_PREFILL_TOKENS_CPU = 512
# A CPU prompt that needs several chunks reads this many tokens first, so the chat page's "reading
# your message" count moves within a second or two of Send (a first 512-token chunk took ~2.5 s on
# two busy cores); a GPU reads 8,192 tokens in well under a second, so it starts with a full chunk
FIRST_PREFILL_CHUNK_CPU = 128
DEFAULT_PREFILL_TOKENS_GPU = 8192
# A GPU's attention kernels read a page's tokens as one contiguous block: nano-vllm's offline
# workload ran 24,908 / 24,935 tok/s with 32-token pages against 24,005 / 24,025 with 1-token ones
# in one call on an H200 (docs/benchmarks.md, fifteenth round), and 64-token pages ran ahead of
# 32-token ones in 6 of 7 pairs of runs (25,001-25,031 against 24,609-25,000 in the sixteenth
# round). The radix cache then shares prefixes in whole pages (a regenerated reply recomputes at
# most 63 prompt tokens, well under a millisecond of prefill). A CPU keeps 1: exact reuse.
DEFAULT_PAGE_SIZE_GPU = 64
DEFAULT_PAGE_SIZE_CPU = 1
CPU_KV_MAX_BYTES = (
    1 << 30
)  # a laptop shares its RAM (and zeroing a big pool is slow): cap the default


def _check_config(config: EngineConfig, tp_size: int) -> None:
    """Flags that no model could serve, refused before anything loads."""
    if config.page_size < 0:
        raise UserError(f"--page-size must be >= 1 (or 0: by device), got {config.page_size}")
    if config.cpu_threads < 0:
        raise UserError(f"--cpu-threads must be >= 0 (0: the free cores), got {config.cpu_threads}")
    if config.tp != tp_size:
        raise UserError(
            f"--tp {config.tp} needs {config.tp} scheduler processes in one group; start it with `minisgl-chat serve --tp {config.tp}`"
        )
    if config.cuda_graph_max_bs < 0:
        raise UserError(f"--cuda-graph-max-bs must be >= 0, got {config.cuda_graph_max_bs}")


def default_page_size(device_type: str) -> int:
    """Tokens per KV page when ``--page-size`` is left at 0."""
    return DEFAULT_PAGE_SIZE_GPU if device_type == "cuda" else DEFAULT_PAGE_SIZE_CPU


class StepResult:
    """The tokens one step sampled (and the logprobs some requests asked for), copied to the CPU
    without blocking; ``tokens()`` waits for them."""

    def __init__(
        self,
        next_ids: torch.Tensor | None,
        logprobs: Logprobs | None = None,
        prompt: PromptLogprobs | None = None,
    ) -> None:
        self._event = None
        self._logprobs = logprobs
        self._prompt = prompt
        self._tokens: list[int] | None = None
        tensors = {"next_ids": next_ids}
        if logprobs is not None:
            tensors.update(
                chosen=logprobs.chosen, top_ids=logprobs.top_ids, top_logprobs=logprobs.top_logprobs
            )
        if prompt is not None:
            tensors.update(
                prompt_chosen=prompt.chosen,
                prompt_top_ids=prompt.top_ids,
                prompt_top_logprobs=prompt.top_logprobs,
            )
        tensors = {name: t for name, t in tensors.items() if t is not None}
        if any(t.is_cuda for t in tensors.values()):
            self._cpu = {
                name: t.to("cpu", non_blocking=True) for name, t in tensors.items()
            }  # into pinned memory
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._cpu = tensors

    def _read(self, name: str) -> list | None:
        if self._event is not None:
            self._event.synchronize()
        return self._cpu[name].tolist() if name in self._cpu else None

    def tokens(self) -> list[int]:
        """The sampled token of each sampling request, in order (read once, then kept)."""
        if self._tokens is None:
            self._tokens = self._read("next_ids") or []
        return self._tokens

    def logprobs(self) -> list[TokenLogprobs | None]:
        """For each sampling request, its token's logprobs if it asked for them (after tokens())."""
        result: list[TokenLogprobs | None] = [None] * len(self.tokens())
        if self._logprobs is None:
            return result
        entries = _token_logprobs(
            self._read("chosen"),
            self._read("top_ids"),
            self._read("top_logprobs"),
            [1] * len(self._logprobs.rows),
            self._logprobs.counts,
        )
        for row, (entry,) in zip(self._logprobs.rows, entries):
            result[row] = entry
        return result

    def prompt_logprobs(self) -> list[tuple[int, list[TokenLogprobs]]]:
        """(uid, the logprobs of its prompt tokens scored in this step) for each request that
        asked for prompt logprobs and had prompt tokens in this step."""
        if self._prompt is None:
            return []
        p = self._prompt
        entries = _token_logprobs(
            self._read("prompt_chosen"),
            self._read("prompt_top_ids"),
            self._read("prompt_top_logprobs"),
            p.rows,
            p.counts,
        )
        return list(zip(p.uids, entries))


def _token_logprobs(
    chosen: list[float],
    top_ids: list | None,
    top_lps: list | None,
    rows: list[int],
    counts: list[int],
) -> list[list[TokenLogprobs]]:
    """Cut flat per-row lists into one list of entries per request (``rows[i]`` rows each),
    keeping each request's own number of alternatives."""
    out, start = [], 0
    for n, count in zip(rows, counts):
        out.append(
            [
                TokenLogprobs(
                    chosen[j],
                    list(zip(top_ids[j][:count], top_lps[j][:count]))
                    if top_ids is not None
                    else [],
                )
                for j in range(start, start + n)
            ]
        )
        start += n
    return out


class Engine:
    def __init__(self, config: EngineConfig, on_phase: Callable[[str], None] | None = None) -> None:
        """``on_phase`` hears what start-up is doing (compiling kernels, capturing graphs).

        Start-up in order: check the flags, load the model, pick the kernels, size and allocate
        the KV cache, set up sampling, capture the CUDA graphs."""
        self.tp = get_tp()
        _check_config(config, self.tp.size)
        self.config = config
        self._load_model(config)
        if self.tp.size > 1:
            torch.manual_seed(config.seed)  # every rank samples the same tokens
        self.attn_name = self._choose_attention(on_phase)
        self.fused_kernels = self._enable_fast_ops(on_phase)
        self._allocate_kv_cache()
        # CPU, weights in the C kernels' layout: batch-1 decode as one C call for every layer
        self.native_decode = (
            self.device.type == "cpu"
            and self.attn_name == "torch"
            and enable_native_decode(self.model, self.kv_pool)
        )
        self.sampler = Sampler(
            use_flashinfer=self.attn_name == "flashinfer",
            seed=config.seed if self.tp.size > 1 else None,
        )
        self.eos_token_ids = self._eos_token_ids()
        self.logits_processor = LogitsProcessor(
            self.model_config.vocab_size,
            config.max_running_requests,
            self.device,
            self.eos_token_ids,
        )
        # the newest sampled token of each page-table row: the next decode step's input
        self.last_token = torch.zeros(
            config.max_running_requests, dtype=torch.int64, device=self.device
        )
        self.graph_runner = None
        max_graph_bs = min(config.cuda_graph_max_bs, config.max_running_requests)
        if self.attn_name == "flashinfer" and max_graph_bs > 0:
            from .kernels.cuda_graph import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(self, max_graph_bs, on_phase)

    def _load_model(self, config: EngineConfig) -> None:
        """The weights on their device, and what the rest of start-up reads from the model."""
        loaded = load_model(config)
        self.model = loaded.model
        self.model_config = mc = loaded.config
        self.hf_config = loaded.hf_config
        self.model_dir = loaded.model_dir
        self.device = loaded.device
        self.dtype = loaded.dtype
        # gguf | awq | gptq | int4 | int8 | fp8 | none (model_loader.choose_quantization)
        self.quantization = loaded.quantization
        self.weight_bytes = loaded.weight_bytes  # as held on the device
        # the KV pool's (--kv-dtype)
        self.kv_dtype = resolve_kv_dtype(config.kv_dtype, self.dtype, self.device.type)
        # CPU: the cores other processes leave free (a browser beside the chat app is the common
        # case), shared among the tensor-parallel ranks of this machine
        self.cpu_threads = (
            CpuThreads(config.cpu_threads, share=self.tp.size)
            if self.device.type == "cpu"
            else None
        )
        self.max_context_len = mc.max_context_len
        # a GPU computes a big prefill batch about as fast per token as a small one and each step
        # launches the same kernels, so fewer, larger chunks win; a CPU keeps chunks short so that
        # running replies are not stalled for long
        self.max_prefill_tokens = config.max_prefill_tokens or (
            DEFAULT_PREFILL_TOKENS_GPU if self.device.type == "cuda" else DEFAULT_PREFILL_TOKENS_CPU
        )
        self.first_prefill_chunk = (
            min(FIRST_PREFILL_CHUNK_CPU, self.max_prefill_tokens)
            if self.device.type == "cpu"
            else self.max_prefill_tokens
        )
        self.page_size = config.page_size or default_page_size(self.device.type)
        # this rank's share of the heads: the KV pool and attention hold only those
        self.num_heads, self.num_kv_heads, _ = local_head_counts(mc.num_heads, mc.num_kv_heads)

    def _allocate_kv_cache(self) -> None:
        """The KV pool (sized by the memory left after the model), the page table and the
        attention backend that reads them."""
        mc = self.model_config
        self.num_pages = self._num_kv_pages()
        self.kv_pool = KVPool(
            mc.num_layers,
            self.num_pages,
            self.page_size,
            self.num_kv_heads,
            mc.head_dim,
            self.kv_dtype,
            self.device,
        )
        self.page_table = PageTable(
            self.config.max_running_requests, self.max_context_len, self.device, self.page_size
        )
        self.attn_backend = create_attention_backend(
            self.attn_name,
            dtype=self.dtype,
            device=self.device,
            kv_pool=self.kv_pool,
            page_table=self.page_table,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=mc.head_dim,
            triton_decode=self.config.fused_kernels,  # --no-fused-kernels: none of our Triton kernels
        )
        logger.info(
            "KV cache: %d tokens (%d pages of %d) on %s in %s; attention: %s",
            self.num_pages * self.page_size,
            self.num_pages,
            self.page_size,
            self.device,
            str(self.kv_dtype).removeprefix("torch."),
            self.attn_name,
        )

    def _enable_fast_ops(self, on_phase: Callable[[str], None] | None) -> dict[str, object]:
        """With FlashInfer attention: its norm/activation ops, then (``--fused-kernels``) the
        Triton kernels measured faster than cuBLAS and, with --tp in bf16 and asked for, the fused
        all-reduce + RMSNorm. Returns what was chosen, for the log and the benchmarks."""
        if self.attn_name != "flashinfer":
            return {"triton": False}
        enable_flashinfer_ops(self.model)
        if not self.config.fused_kernels:
            return {"triton": False}
        from .kernels.fused_ops import enable_fused_kernels

        chosen = enable_fused_kernels(self.model, on_phase)
        # every rank alike
        if self.tp.size > 1 and self.dtype == torch.bfloat16 and fused_all_reduce_norm_wanted():
            from .kernels.fused_ops import enable_fused_all_reduce_norm

            chosen["all_reduce_norm"] = enable_fused_all_reduce_norm(
                self.model, self.device, self.model_config.hidden_size, on_phase
            )
        return chosen

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.graph_runner is not None

    def _choose_attention(self, on_phase: Callable[[str], None] | None) -> str:
        """``auto``: FlashInfer on CUDA when it imports and its kernels build, else torch (with
        a one-line notice on CUDA). ``flashinfer`` that cannot run is an error."""
        asked = self.config.attn
        if asked not in ("auto", "flashinfer", "torch"):
            raise UserError(f"--attn {asked!r}: choose auto, flashinfer or torch")
        if asked == "torch" or (asked == "auto" and self.device.type != "cuda"):
            return "torch"
        reason = flashinfer_kernels.unavailable_reason(
            self.device, self.dtype, self.model_config.head_dim
        )
        if reason is None:
            try:
                from .attention.flashinfer_backend import decode_uses_tensor_cores

                # this rank's heads
                tensor_cores = decode_uses_tensor_cores(
                    self.num_heads, self.num_kv_heads, self.kv_dtype
                )
                flashinfer_kernels.build_kernels(
                    self.dtype, self.model_config.head_dim, on_phase, tensor_cores, self.kv_dtype
                )
            except Exception as exc:  # no nvcc, a compiler error, ...
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                reason = f"its kernels could not be built ({first[:200]})"
        if reason is None:
            return "flashinfer"
        if asked == "flashinfer":
            raise UserError(f"--attn flashinfer: {reason}; use --attn torch")
        logger.warning("attention: using the slower torch backend because %s", reason)
        return "torch"

    def _eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from config.json and generation_config.json (chat models often list several)."""
        ids = set(self.model_config.eos_token_ids)
        if self.model_dir is not None:
            from .hf_config import generation_eos_token_ids

            ids.update(generation_eos_token_ids(self.model_dir))
        return tuple(sorted(ids))

    def _num_kv_pages(self) -> int:
        """From --max-kv-tokens, else --mem-fraction of the memory free after the weights (the
        rest stays for activations, CUDA graphs and FlashInfer's workspace)."""
        mc = self.model_config
        per_token = KVPool.bytes_per_token(
            mc.num_layers, self.num_kv_heads, mc.head_dim, self.kv_dtype
        )
        if self.config.max_kv_tokens is not None:
            tokens = self.config.max_kv_tokens
        else:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            budget = free_memory_bytes(self.device) * self.config.mem_fraction
            if self.device.type == "cpu":
                budget = min(budget, CPU_KV_MAX_BYTES)
            tokens = min(
                int(budget // per_token), self.config.max_running_requests * self.max_context_len
            )
            # every rank must hold the same pages: size them to the rank with the least memory
            tokens = min_over_ranks(tokens, self.device)
        if tokens < self.page_size:
            raise UserError(
                f"the KV cache would hold only {tokens} tokens; raise --max-kv-tokens or free memory"
            )
        return math.ceil(tokens / self.page_size)

    def graph_size(self, batch: Batch) -> int | None:
        """The CUDA graph size this batch replays at, or None to run it eagerly."""
        if self.graph_runner is None or not batch.is_decode:
            return None
        return self.graph_runner.size_for(batch.size)

    def prepare(self, batch: Batch, pad_to: int | None = None) -> ForwardBatch:
        """Lay the batch out as flat tensors (all requests' new tokens back to back), with one
        host-to-device copy (:func:`.batch_layout.build_forward_batch`). ``pad_to`` adds padding rows
        to a decode batch (CUDA graphs)."""
        return build_forward_batch(
            batch, self.page_table, self.last_token, self.kv_pool.padding_slot, self.device, pad_to
        )

    def _forward(
        self, batch: Batch, use_graph: bool | None = None, pad_to: int | None = None
    ) -> tuple[ForwardBatch, torch.Tensor]:
        if self.cpu_threads is not None:
            self.cpu_threads.apply()
        graph_size = self.graph_size(batch)
        if use_graph and graph_size is None:
            raise ValueError("this batch cannot replay a CUDA graph")
        replay = graph_size is not None and use_graph is not False
        fb = self.prepare(batch, pad_to=graph_size if replay else pad_to)
        # a batch padded to a graph's size is planned as that graph's attention (its FlashInfer
        # wrapper, or the Triton decode kernels), also when it runs eagerly: then the two differ
        # only in how the kernels are launched
        fb.use_graph = graph_size is not None and fb.padded_size == graph_size
        self.attn_backend.prepare(fb)
        logits = self.graph_runner.replay(fb) if replay else self.model(fb, self.attn_backend)
        return fb, logits[: logits.shape[0] - fb.num_padding]

    @torch.inference_mode()
    def forward_logits(
        self, batch: Batch, use_graph: bool | None = None, pad_to: int | None = None
    ) -> torch.Tensor:
        """float32 logits [requests that sample (or every token, with all_logits), vocab].

        ``use_graph``: None = a CUDA graph when one fits, False = eager (``pad_to`` pads the
        batch as a graph would, to compare the two), True = a graph or an error."""
        fb, logits = self._forward(batch, use_graph, pad_to)
        # a replayed graph's logits live in its output buffer, which the next replay overwrites
        return logits.clone() if fb.use_graph else logits

    @torch.inference_mode()
    def forward_batch(
        self, batch: Batch, token_masks: Callable[[list[int]], TokenMasks | None] | None = None
    ) -> StepResult:
        """Queue the batch and its sampling; the result holds one token per request that
        samples, in order. The sampled tokens also become their rows' next decode input.

        ``token_masks`` (grammars) is called with the sampling rows' batch indexes once the
        forward pass is queued, so the CPU fills the masks while the GPU computes the logits."""
        fb, logits = self._forward(batch)
        sampling = [i for i in range(batch.size) if batch.samples(i)]
        prompt = None
        if fb.scored_prompts:  # the rows after the sampling ones
            scored_reqs = [batch.reqs[i] for i, _ in fb.scored_prompts]
            prompt = self.logits_processor.prompt_logprobs(
                logits[len(sampling) :],
                fb.prompt_targets,
                scored_reqs,
                [n for _, n in fb.scored_prompts],
            )
            logits = logits[: len(sampling)]
        if not sampling:
            return StepResult(None, prompt=prompt)
        reqs = [batch.reqs[i] for i in sampling]
        table_rows = [req.table_slot for req in reqs]
        raw_logprobs = self.logits_processor.raw_logprobs(logits, reqs)
        masks = token_masks(sampling) if token_masks is not None else None
        self.logits_processor.apply(logits, reqs, table_rows, masks)
        next_ids = self.sampler.sample(
            logits, [r.params for r in reqs], [r.generator for r in reqs]
        ).long()
        self.logits_processor.record(reqs, table_rows, next_ids)
        if len(sampling) == batch.size:
            rows = fb.table_rows
        else:
            rows = fb.table_rows[to_device(sampling, self.device)]
        self.last_token.index_copy_(0, rows, next_ids)
        logprobs = (
            self.logits_processor.gather_logprobs(raw_logprobs, reqs, next_ids)
            if raw_logprobs is not None
            else None
        )
        return StepResult(next_ids, logprobs, prompt)
