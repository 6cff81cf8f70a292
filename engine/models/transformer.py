"""The decoder-only transformer shared by Llama, Mistral, Qwen2 and Qwen3.

The four families differ only in flags of the same blocks: Qwen2 adds a bias to the QKV
projection, Qwen3 normalises each head of q and k; Llama 3 scales RoPE frequencies. Module
names follow the Hugging Face checkpoints, except the merged ``qkv_proj`` and ``gate_up_proj``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from ..attention.base import AttentionBackend
from ..batch import ForwardBatch
from ..config import ModelConfig
from ..distributed import all_gather_last_dim, get_tp
from ..errors import WeightsError
from ..layers.activation import silu_and_mul
from ..layers.attention import SelfAttention
from ..layers.embedding import Embedding, split_by_vocab, vocab_block
from ..layers.linear import (
    Linear,
    MergedLinear,
    RowParallelLinear,
    default_weight_loader,
    float32_logits,
)
from ..layers.norm import RMSNorm
from ..layers.quantized import (
    GROUP,
    NativeRows,
    NativeWeight,
    PackedWeight,
    Planes,
    QuantizedRows,
    drop_weight,
    int4_checkpoint_planes,
    pack_weight,
    planes_of,
    quantize_float,
    stack_rows,
)
from ..layers.quantized_gpu import GpuGroupWeight, gpu_group_weight
from ..layers.rotary import RopeInputs, RotaryEmbedding
from ..weights.fp8_checkpoint import Fp8Weight
from ..weights.gguf_tensors import GGUFTensor
from ..weights.int4_checkpoint import Int4Weight

logger = logging.getLogger(__name__)

# logits per row that torch's packed LM head recomputes in float32 (CausalLM._refine_top_logits;
# our C kernels' head writes float32 from 16-bit activations and needs none)
REFINED_LOGITS = 64

# checkpoint name part -> (our merged module name part, shard id)
MERGED_WEIGHTS = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", "gate"),
    ".up_proj.": (".gate_up_proj.", "up"),
}


class MLP(nn.Module):
    use_flashinfer = False
    # rows up to which one Triton kernel computes silu(x @ gate.T) * (x @ up.T) (set on CUDA),
    # and the one-row kernel's plan for a single row (block_n 0: not used), as in Linear
    fused_max_rows = 0
    gemv_plan: tuple[int, int] = (0, 0)  # triton_kernels.GemvPlan: (block_n, per_sm)
    gemv_pdl = False

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        tp = get_tp()
        local = tp.split(intermediate_size, "MLP intermediate features")
        self.gate_up_proj = MergedLinear(
            hidden_size, [local] * 2, ("gate", "up"), shard_parts=[tp.rank] * 2
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, all_reduce_buffer=1
        )  # attention's uses 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quant = self.gate_up_proj.quant
        if isinstance(quant, GpuGroupWeight) and self.gate_up_proj.bias is None:
            return self.down_proj(quant.matmul(x, silu_mul=True))
        if x.shape[0] == 1 and self.gemv_plan[0]:
            from ..kernels.triton_kernels import gemv

            return self.down_proj(
                gemv(
                    x,
                    self.gate_up_proj.weight,
                    silu_mul=True,
                    block_n=self.gemv_plan[0],
                    per_sm=self.gemv_plan[1],
                    pdl=self.gemv_pdl,
                    scale=self.gate_up_proj.weight_scale,
                )
            )
        if 0 < x.shape[0] <= self.fused_max_rows:
            from ..kernels.triton_kernels import skinny_matmul

            return self.down_proj(skinny_matmul(x, self.gate_up_proj.weight, silu_mul=True))
        return self.down_proj(silu_and_mul(self.gate_up_proj(x), fused=self.use_flashinfer))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = SelfAttention(
            layer_id,
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            qkv_bias=config.attention_bias,
            qk_norm_eps=config.rms_norm_eps if config.qk_norm else None,
        )
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # CUDA, one row (batch-1 decode): each residual add + RMSNorm rides inside the one-row
        # product after it (triton_kernels.add_norm_gemv); set by fused_ops where that product runs
        self.norms_in_gemv = False
        # (qkv, gate_up) one-row plans (GemvPlan), norms out / in (fused_ops.place_norms)
        self.gemv_plans: dict[bool, tuple[tuple[int, int], tuple[int, int]]] | None = None

    def forward(
        self,
        rope: RopeInputs,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.norms_in_gemv and hidden.shape[0] == 1 and residual is not None:
            return self._forward_one_row(rope, hidden, residual, batch, attn)
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rope, batch, attn)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def _forward_one_row(
        self, rope, hidden, residual, batch, attn
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer with its two norms inside the products that follow them: two kernels
        fewer per layer at batch 1."""
        from ..kernels.triton_kernels import add_norm_gemv

        qkv_proj, mlp = self.self_attn.qkv_proj, self.mlp
        norm = self.input_layernorm
        qkv, residual = add_norm_gemv(
            hidden,
            residual,
            norm.weight,
            norm.eps,
            qkv_proj.weight,
            qkv_proj.bias,
            block_n=qkv_proj.gemv_plan[0],
            per_sm=qkv_proj.gemv_plan[1],
            pdl=qkv_proj.gemv_pdl,
            scale=qkv_proj.weight_scale,
        )
        hidden = self.self_attn.attend_qkv(qkv, rope, batch, attn)
        norm = self.post_attention_layernorm
        act, residual = add_norm_gemv(
            hidden,
            residual,
            norm.weight,
            norm.eps,
            mlp.gate_up_proj.weight,
            silu_mul=True,
            block_n=mlp.gemv_plan[0],
            per_sm=mlp.gemv_plan[1],
            pdl=mlp.gemv_pdl,
            scale=mlp.gate_up_proj.weight_scale,
        )
        return mlp.down_proj(act), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(
            config.head_dim, config.max_context_len, config.rope_theta, config.rope_scaling, dtype
        )
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # CPU with the C kernels' weights: batch-1 decode runs every layer in one C call
        # (native_decode.NativeDecoder, set by enable_native_decode)
        self.native_decoder = None

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        hidden = self.embed_tokens(batch.input_ids)
        if self.native_decoder is not None and batch.is_decode and hidden.shape[0] == 1:
            slots = getattr(batch.attn_metadata, "one_request_slots", None)
            if slots is not None and self.native_decoder.fits(slots):
                return self.native_decoder.step(hidden, slots, int(batch.positions[0]))
        residual = None
        rope = self.rotary.prepare(batch.positions)
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual, batch, attn)
        hidden, _ = self.norm(hidden, residual)
        return hidden


def enable_flashinfer_ops(model: nn.Module) -> None:
    """Switch every layer that has a FlashInfer kernel (RMSNorm, RoPE, SiLU-and-mul) to it."""
    for module in model.modules():
        if hasattr(type(module), "use_flashinfer"):
            module.use_flashinfer = True


class CausalLM(nn.Module):
    """``forward`` returns float32 logits for the rows in ``batch.logits_indices`` only: the
    LM head is the largest matrix of a small model, so other positions skip it.

    With tensor parallelism each rank builds only its shard (heads, MLP columns, vocabulary
    block) and loads only its slices of each checkpoint tensor."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, dtype)
        self.lm_head = None
        self.tied_lm_head_packed: NativeWeight | PackedWeight | None = None
        if not config.tie_word_embeddings:  # split by vocabulary like the embedding
            self.lm_head = Linear(config.hidden_size, vocab_block(config.vocab_size)[1])
            split_by_vocab(self.lm_head.weight, config.vocab_size)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def lm_head_packed(self) -> NativeWeight | PackedWeight | GpuGroupWeight | None:
        """The LM head's packed matrix with quantized weights (tied, CPU only: its own copy,
        since the embedding keeps its blocks for lookups)."""
        return self.tied_lm_head_packed if self.lm_head is None else self.lm_head.quant

    def forward(
        self, batch: ForwardBatch, attn: AttentionBackend, logits_out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``logits_out``: a float32 [rows, vocab] buffer to write the logits into (a CUDA
        graph's output); the result is that buffer when it could be written directly."""
        hidden = self.model(batch, attn)
        if not batch.is_decode:  # a decode step samples every row: no rows to pick
            hidden = hidden[batch.logits_indices]
        if isinstance(self.lm_head_packed, GpuGroupWeight):
            logits = self.lm_head_packed.matmul(hidden, out_dtype=torch.float32)
            return logits if logits_out is None else logits_out.copy_(logits)
        if self.lm_head_packed is not None:
            logits = self.lm_head_packed.matmul(hidden).float()
            if isinstance(self.lm_head_packed, PackedWeight):  # bf16 output: see _refine_top_logits
                logits = self._refine_top_logits(hidden, logits)
            return logits if logits_out is None else logits_out.copy_(logits)
        if get_tp().size > 1:
            # each rank has its vocabulary block's logits: gather them (dropping the padding rows)
            logits = all_gather_last_dim(float32_logits(hidden, self.lm_head_weight))[
                :, : self.config.vocab_size
            ]
            return logits if logits_out is None else logits_out.copy_(logits)
        return float32_logits(hidden, self.lm_head_weight, logits_out)

    def _refine_top_logits(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The packed kernel writes bf16, whose step near a logit of 25 is 0.125: close
        candidates tie and greedy picks by index. The top ``REFINED_LOGITS`` of each row are
        computed again in float32 from the table's rows (tied LM heads, whose rows the
        embedding keeps; an untied packed head keeps the bf16 values)."""
        if self.lm_head is not None or logits.shape[0] == 0:
            return logits
        table = self.model.embed_tokens
        top = logits.topk(min(REFINED_LOGITS, logits.shape[1]), dim=-1).indices
        rows = (
            table.quant_rows.lookup(top, torch.float32)
            if table.quant_rows is not None
            else table.weight[top].float()
        )
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(1, top, exact)

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor | GGUFTensor]],
        keep_quantized: bool = False,
        quantize_on: torch.device | None = None,
    ) -> None:
        """Copy checkpoint tensors into our parameters (casting dtype); every parameter must be
        filled exactly once, so a truncated or mismatched checkpoint fails loudly.

        A GGUF's quantized matrices (and an AWQ/GPTQ checkpoint's, :class:`Int4Weight`) are
        widened, or with ``keep_quantized`` repacked for the quantized kernels of
        ``quantize_on`` (default: the parameters' device) once all parts of each merged matrix
        are in. FP8 matrices passed as stored (:class:`Fp8Weight`) are held
        in FP8 on ``quantize_on`` where the engine holds that projection in FP8 (the decoder
        layers'), widened elsewhere."""
        quantized: dict[str, dict[str | int | None, GGUFTensor | Int4Weight]] = {}
        params = dict(self.named_parameters())
        missing = {
            (name, shard)
            for name, mod in self.named_modules()
            for shard in getattr(mod, "shards", {})
        }
        missing = {
            (f"{n}.{p}", s) for n, s in missing for p in ("weight", "bias") if f"{n}.{p}" in params
        }
        missing |= {(name, None) for name, p in params.items() if not hasattr(p, "weight_loader")}
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied to the embedding
            shard_id = None
            for part, (merged, shard) in MERGED_WEIGHTS.items():
                if part in name:
                    name, shard_id = name.replace(part, merged), shard
                    break
            param = params.get(name)
            if param is None:
                raise WeightsError(
                    f"checkpoint tensor {name!r} has no place in a {self.config.model_type} model"
                )
            if isinstance(tensor, Fp8Weight):
                if self._load_fp8_part(name, tensor, shard_id, quantize_on):
                    missing.discard((name, shard_id))
                    continue
                tensor = tensor.dequantize()
            if isinstance(tensor, (GGUFTensor, Int4Weight)):
                if keep_quantized and name.endswith(".weight"):
                    quantized.setdefault(name.removesuffix(".weight"), {})[shard_id] = tensor
                    missing.discard((name, shard_id))
                    continue
                tensor = tensor.dequantize()
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor, shard_id)  # the loader casts (and reads a lazy slice)
            except ValueError as exc:
                raise WeightsError(
                    f"checkpoint tensor {name!r} does not fit the config: {exc}"
                ) from None
            missing.discard((name, shard_id))
        if missing:
            name, shard = sorted(missing, key=str)[0]
            example = name if shard is None else f"{name} ({shard} part)"
            raise WeightsError(f"checkpoint is missing {len(missing)} tensors, e.g. {example!r}")
        for module_name, parts in quantized.items():
            self._install_quantized(module_name, parts, quantize_on)

    def _install_quantized(
        self,
        module_name: str,
        parts: dict[str | int | None, GGUFTensor | Int4Weight],
        device: torch.device | None,
    ) -> None:
        module = self.get_submodule(module_name)
        device = device or module.weight.device
        on_gpu = device.type == "cuda"
        order = list(getattr(module, "shards", {None: None}))
        if isinstance(next(iter(parts.values())), Int4Weight):
            self._install_int4(module_name, module, [parts[key] for key in order], device)
            return
        if isinstance(module, Embedding):
            (table,) = parts.values()
            if table.shape != tuple(module.weight.shape):
                raise WeightsError(
                    f"checkpoint tensor {module_name}.weight {table.shape} does not fit the config"
                )
            if on_gpu:  # lookups and a tied LM head read the table widened (one copy)
                module.weight.data.copy_(table.dequantize())
                return
            if self.lm_head is None:  # tied: the LM head multiplies by the same table
                self.tied_lm_head_packed = pack_weight(
                    planes_of(table.raw, table.qtype, table.shape)
                )
            if isinstance(
                self.tied_lm_head_packed, NativeWeight
            ):  # one copy: lookups read the head's codes
                module.quant_rows = NativeRows(self.tied_lm_head_packed)
            else:  # the file's blocks, copied out of the file's mapping
                module.quant_rows = QuantizedRows(table.raw.clone(), table.qtype, table.shape[1])
            module.weight = drop_weight(module.weight)
            return
        planes = stack_rows(
            [
                planes_of(
                    parts[key].raw, parts[key].qtype, parts[key].shape, device if on_gpu else None
                )
                for key in order
            ]
        )
        if planes.codes.shape[1:] != tuple(module.weight.shape):
            raise WeightsError(
                f"checkpoint tensor {module_name}.weight {tuple(planes.codes.shape[1:])} does not fit the config"
            )
        self._hold_quantized(module, planes)

    def _install_int4(
        self, module_name: str, module: nn.Module, parts: list[Int4Weight], device: torch.device
    ) -> None:
        """An AWQ/GPTQ matrix held as 4-bit group codes (``int4_checkpoint_planes``); an
        embedding widened into its weight (said in the log)."""
        shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        if shape != tuple(module.weight.shape):
            raise WeightsError(
                f"checkpoint tensor {module_name}.weight {shape} does not fit the config"
            )
        if not isinstance(module, Linear):
            logger.info("%s: 4-bit weights widened (an embedding)", module_name)
            module.weight.data.copy_(torch.cat([p.dequantize() for p in parts]))
            return
        planes = int4_checkpoint_planes(parts, device if device.type == "cuda" else None)
        self._hold_quantized(module, planes)

    @staticmethod
    def _hold_quantized(module: Linear, planes: Planes) -> None:
        """``module``'s weight held as ``planes`` in the kernel form of the planes' device;
        widened into the weight where that form does not take the shape (the GPU's group
        kernels)."""
        codes = planes.codes
        quant = gpu_group_weight(planes, codes.device) if codes.is_cuda else pack_weight(planes)
        if quant is None:
            module.weight.data.copy_(planes.dequantize())
            return
        module.quant = quant
        module.weight = drop_weight(module.weight)

    def _load_fp8_part(
        self, name: str, part: Fp8Weight, shard_id: str | None, device: torch.device | None
    ) -> bool:
        """One stored FP8 matrix (or one part of a merged one) into its projection's FP8 weight
        and row scales, through the projection's own loader (which picks a tensor-parallel
        rank's block); the first part turns the projection's weight into FP8. False for a
        matrix the engine does not hold in FP8 (the LM head): the caller widens it."""
        module_name = name.removesuffix(".weight")
        if not (module_name.startswith("model.layers.") and name.endswith(".weight")):
            return False
        module = self.get_submodule(module_name)
        if not isinstance(module, Linear):
            return False
        if module.weight_scale is None:
            from ..layers.fp8 import FP8

            shape, device = module.weight.shape, device or module.weight.device
            self._hold_fp8(
                module,
                torch.empty(shape, dtype=FP8, device=device),
                torch.ones(shape[0], device=device),
            )
        loader = getattr(module.weight, "weight_loader", default_weight_loader)
        # a scale per output row: a merged projection's part (and a rank's block of it) goes
        # where its rows go; other projections' rows are whole on every rank
        scale_loader = loader if isinstance(module, MergedLinear) else default_weight_loader
        try:
            loader(module.weight, part.codes, shard_id)
            scale_loader(module.weight_scale, part.scale, shard_id)
        except ValueError as exc:
            raise WeightsError(
                f"checkpoint tensor {name!r} does not fit the config: {exc}"
            ) from None
        return True

    def quantize_fp8(self, device: torch.device | None = None) -> int:
        """``--quantization fp8`` (GPU): every projection of the decoder layers to FP8 with a
        scale per row (layers/fp8.py); the embedding and the LM head stay, and so do projections
        loaded in FP8 already (``_load_fp8_part``). One matrix at a time (the 16-bit copy of
        each is freed as it goes; from host memory, each goes to ``device``). Returns the bytes
        saved."""
        from ..layers.fp8 import quantize_fp8

        saved = 0
        for module in self.model.layers.modules():
            if isinstance(module, Linear) and module.quant is None and module.weight_scale is None:
                weight = module.weight
                fp8_weight, scale = quantize_fp8(weight.data.to(device or weight.device))
                saved += (
                    weight.numel() * weight.element_size() - fp8_weight.numel() - 4 * scale.numel()
                )
                self._hold_fp8(module, fp8_weight, scale)
                del weight
        return saved

    @staticmethod
    def _hold_fp8(module: Linear, fp8_weight: torch.Tensor, scale: torch.Tensor) -> None:
        """``module``'s weight held as ``fp8_weight`` with a scale per output row; its products
        take the old weight's dtype for the activations, and its loader stays (a checkpoint's
        later parts of a merged projection go through it)."""
        old = module.weight
        module.compute_dtype = old.dtype
        module.weight = nn.Parameter(fp8_weight, requires_grad=False)
        if hasattr(old, "weight_loader"):
            module.weight.weight_loader = old.weight_loader
        module.weight_scale = scale

    def quantize(self, kind: str, device: torch.device | None = None) -> None:
        """``--quantization int4 | int8``: pack every projection and the LM head of a float
        checkpoint (the embedding stays float for lookups) for ``device``'s kernels (default: the
        weights' device; from host memory, each matrix goes there quantized)."""
        device = device or self.model.embed_tokens.weight.device
        for module in self.modules():
            if isinstance(module, Linear) and module.weight.shape[1] % GROUP == 0:
                weight = module.weight.data.to(device)
                self._hold_quantized(module, quantize_float(weight, kind))
        on_gpu = device.type == "cuda"  # a tied head reads the float table there
        if self.lm_head is None and self.config.hidden_size % GROUP == 0 and not on_gpu:
            self.tied_lm_head_packed = pack_weight(
                quantize_float(self.model.embed_tokens.weight.data, kind)
            )
