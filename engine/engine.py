"""The engine: owns the model, the KV pool, the page table, the attention backend and the
sampler, and turns one scheduled :class:`Batch` into next tokens."""

from __future__ import annotations

import logging
import math

import torch

from .attention import create_attention_backend
from .batch import Batch, ForwardBatch
from .config import EngineConfig
from .errors import UserError
from .kvcache import KVPool, PageTable
from .model_loader import free_memory_bytes, load_model
from .sampling import Sampler

logger = logging.getLogger(__name__)

CPU_KV_MAX_BYTES = 1 << 30  # a laptop shares its RAM (and zeroing a big pool is slow): cap the default


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        if config.page_size < 1:
            raise UserError(f"--page-size must be >= 1, got {config.page_size}")
        if config.tp != 1:
            raise UserError(f"--tp {config.tp}: tensor parallelism is not available yet; use --tp 1")
        self.config = config
        loaded = load_model(config)
        self.model = loaded.model
        self.model_config = loaded.config
        self.hf_config = loaded.hf_config
        self.model_dir = loaded.model_dir
        self.device = loaded.device
        self.dtype = loaded.dtype
        if self.device.type == "cpu":
            torch.set_num_threads(torch.get_num_threads())  # all cores (torch's default)
        mc = self.model_config
        self.max_context_len = mc.max_context_len
        self.page_size = config.page_size
        self.num_pages = self._num_kv_pages()
        self.kv_pool = KVPool(mc.num_layers, self.num_pages, self.page_size, mc.num_kv_heads, mc.head_dim, self.dtype, self.device)
        self.page_table = PageTable(config.max_running_requests, self.max_context_len, self.device)
        self.attn_backend = create_attention_backend(
            config.attn,
            self.device,
            kv_pool=self.kv_pool,
            page_table=self.page_table,
            num_heads=mc.num_heads,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
        )
        self.sampler = Sampler()
        self.eos_token_ids = self._eos_token_ids()
        logger.info(
            "KV cache: %d tokens (%d pages of %d) on %s in %s",
            self.num_pages * self.page_size, self.num_pages, self.page_size, self.device, str(self.dtype).removeprefix("torch."),
        )

    def _eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from config.json and generation_config.json (chat models often list several)."""
        ids = set(self.model_config.eos_token_ids)
        if self.model_dir is not None and (self.model_dir / "generation_config.json").exists():
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(self.model_dir).eos_token_id
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return tuple(sorted(ids))

    def _num_kv_pages(self) -> int:
        mc = self.model_config
        per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, self.dtype)
        if self.config.max_kv_tokens is not None:
            tokens = self.config.max_kv_tokens
        else:
            budget = free_memory_bytes(self.device) * self.config.mem_fraction
            if self.device.type == "cpu":
                budget = min(budget, CPU_KV_MAX_BYTES)
            tokens = min(int(budget // per_token), self.config.max_running_requests * self.max_context_len)
        if tokens < self.page_size:
            raise UserError(f"the KV cache would hold only {tokens} tokens; raise --max-kv-tokens or free memory")
        return math.ceil(tokens / self.page_size)

    def prepare(self, batch: Batch) -> ForwardBatch:
        """Lay the batch out as flat tensors (all requests' new tokens back to back)."""
        input_ids: list[int] = []
        positions: list[int] = []
        out_loc: list[torch.Tensor] = []
        logits_indices: list[int] = []
        cached_lens = [req.cached_len for req in batch.reqs]
        table = self.page_table.table
        for i, (req, extend) in enumerate(zip(batch.reqs, batch.extend_lens)):
            start = req.cached_len
            input_ids.extend(req.token_ids[start : start + extend])
            positions.extend(range(start, start + extend))
            out_loc.append(table[req.table_slot, start : start + extend])
            if batch.all_logits:
                logits_indices.extend(range(len(input_ids) - extend, len(input_ids)))
            elif batch.samples(i):
                logits_indices.append(len(input_ids) - 1)
        device = self.device
        return ForwardBatch(
            phase=batch.phase,
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            out_loc=out_loc[0] if len(out_loc) == 1 else torch.cat(out_loc),
            table_rows=torch.tensor([req.table_slot for req in batch.reqs], dtype=torch.int64, device=device),
            cached_lens=cached_lens,
            extend_lens=list(batch.extend_lens),
            seq_lens=[c + e for c, e in zip(cached_lens, batch.extend_lens)],
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=device),
        )

    @torch.inference_mode()
    def forward_logits(self, batch: Batch) -> torch.Tensor:
        """float32 logits [requests that sample (or every token, with all_logits), vocab]."""
        fb = self.prepare(batch)
        self.attn_backend.prepare(fb)
        return self.model(fb, self.attn_backend)

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> list[int]:
        """Run the batch and sample; returns one token per request that samples, in order."""
        logits = self.forward_logits(batch)
        sampling = [i for i in range(batch.size) if batch.samples(i)]
        if not sampling:
            return []
        reqs = [batch.reqs[i] for i in sampling]
        next_ids = self.sampler.sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
        return next_ids.tolist()
