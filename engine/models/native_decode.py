"""Batch-1 decode on CPU as one C call for every layer (cpu_kernels.c's ``decode_step``).

At batch 1 a small model's step is ~15 small operations a layer; as torch ops each costs a
dispatch that outweighs its arithmetic (the demo model spent more time between its products than
in them). The C step runs the same layer (RMSNorm, the QKV product, q/k norms and RoPE, the KV
write, attention, the output product, the MLP) over the weights in our kernels' layout, on torch's
OpenMP threads; it is used when every projection is a ``NativeWeight``, the KV cache is float32,
float16 or bfloat16 (widened to float32 as attention reads it) and one rank runs the model.
"""

from __future__ import annotations

import ctypes

import torch

from ..distributed import get_tp
from ..kernels.cpu_native import KV_TYPES, LayerStruct, ModelStruct, native_kernels
from ..kvcache.kv_pool import KVPool
from ..layers.quantized import NativeWeight


class NativeDecoder:
    """The C view of a model's layers; ``step`` runs one token through all of them."""

    def __init__(self, model, kv_pool: KVPool, lib) -> None:
        decoder = model.model
        first = decoder.layers[0].self_attn
        self.lib, self.kv_pool, self.decoder = lib, kv_pool, decoder
        self.head_dim = first.head_dim
        self.layers = (LayerStruct * len(decoder.layers))()
        for i, layer in enumerate(decoder.layers):
            sa, mlp = layer.self_attn, layer.mlp
            self.layers[i] = LayerStruct(
                layer.input_layernorm.weight.data_ptr(),
                layer.post_attention_layernorm.weight.data_ptr(),
                sa.q_norm.weight.data_ptr() if sa.q_norm is not None else None,
                sa.k_norm.weight.data_ptr() if sa.k_norm is not None else None,
                *(
                    p.quant.describe(p.bias)
                    for p in (sa.qkv_proj, sa.o_proj, mlp.gate_up_proj, mlp.down_proj)
                ),
                None,
                None,
            )
        self._cache_ptr = None
        self._point_at_cache()
        config = model.config
        self.model = ModelStruct(
            len(decoder.layers),
            config.hidden_size,
            first.num_heads,
            first.num_kv_heads,
            first.head_dim,
            config.intermediate_size,
            config.max_context_len + 1,
            decoder.norm.eps,
            first.head_dim**-0.5,
            self.layers,
            decoder.norm.weight.data_ptr(),
            None,
            KV_TYPES[str(kv_pool.dtype).removeprefix("torch.")],
        )
        self.work = torch.empty(lib.decode_work_floats(ctypes.byref(self.model)))
        self.model.work = self.work.data_ptr()
        self.cos, self.sin = decoder.rotary.cos, decoder.rotary.sin  # [positions, head_dim] float32

    def _point_at_cache(self) -> None:
        """The layers' KV cache pointers (again when the pool's tensors have moved)."""
        for i in range(len(self.layers)):
            self.layers[i].k_cache = self.kv_pool.k_cache[i].data_ptr()
            self.layers[i].v_cache = self.kv_pool.v_cache[i].data_ptr()
        self._cache_ptr = self.kv_pool.k_cache[0].data_ptr()

    def fits(self, slots: torch.Tensor) -> bool:
        """The step's workspace holds this many cached tokens (the model's context, plus one)."""
        return slots.shape[0] <= self.model.max_len

    def step(self, hidden: torch.Tensor, slots: torch.Tensor, position: int) -> torch.Tensor:
        """``hidden``: the token's embedding [1, dim] float32; ``slots``: the request's cache slots
        (int64, contiguous, its own last); returns the final norm's output."""
        if not self.fits(slots):
            raise ValueError(
                f"{slots.shape[0]} cached tokens exceed the decode workspace ({self.model.max_len})"
            )
        if self.kv_pool.k_cache[0].data_ptr() != self._cache_ptr:
            self._point_at_cache()
        hidden = hidden.contiguous().clone() if hidden.dtype == torch.float32 else hidden.float()
        row = self.head_dim * 4 * position
        self.lib.decode_step(
            ctypes.byref(self.model),
            hidden.data_ptr(),
            slots.data_ptr(),
            slots.shape[0],
            self.cos.data_ptr() + row,
            self.sin.data_ptr() + row,
        )
        return hidden


def enable_native_decode(model, kv_pool: KVPool) -> bool:
    """Give the model a NativeDecoder where every layer can take it: C-kernel weights, float32
    activations, a float32 or 16-bit KV cache, heads of a multiple of 16 values, one rank. False:
    batch-1 decode stays torch ops."""
    lib = native_kernels()
    decoder = model.model
    projections = [
        p
        for layer in decoder.layers
        for p in (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        )
    ]
    if (
        lib is None
        or get_tp().size > 1
        or not all(isinstance(p.quant, NativeWeight) for p in projections)
        or str(kv_pool.dtype).removeprefix("torch.") not in KV_TYPES
        or decoder.norm.weight.dtype != torch.float32
        or decoder.rotary.cos.dtype != torch.float32
        or decoder.layers[0].self_attn.head_dim % 16
    ):
        return False
    decoder.native_decoder = NativeDecoder(model, kv_pool, lib)
    return True
