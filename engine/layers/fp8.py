"""FP8 weights on the GPU (``--quantization fp8``): each projection of the decoder layers held as
float8 (e4m3) with one float32 scale per output row, half the bytes of bf16.

A batch-1 decode step reads every weight once and does little else, so its speed is the weight
bytes over the memory bandwidth: FP8 halves them. At one row the one-row Triton kernel
(``triton_kernels.gemv`` with ``scale``) reads the 8-bit weight and widens it in registers (the
activations stay 16-bit). At more rows (prefill, batched decode) the product runs on the tensor
cores' FP8 path (``torch._scaled_mm``) with each token's activations scaled to FP8 as they come
(dynamic per-token scales), the scheme vLLM and SGLang call "FP8 W8A8, per-channel weights". The
embedding and the LM head stay in the model's dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# 8-bit tensor-core products need Ada (8.9) or Hopper and later
FP8_MIN_CAPABILITY = (8, 9)


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 weight [out, in], float32 scale [out]): each row scaled so its largest magnitude
    is FP8's largest value (a zero row gets scale 1)."""
    wide = weight.float()
    amax = wide.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (wide / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (weight.float() * scale[:, None]).to(dtype)


def fp8_unavailable_reason(device: torch.device) -> str | None:
    """Why ``--quantization fp8`` cannot run on ``device`` (None: it can)."""
    if device.type != "cuda":
        return "FP8 weights run on an NVIDIA GPU"
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        return f"this GPU (compute capability {capability[0]}.{capability[1]}) has no FP8 tensor cores; it needs 8.9 (Ada) or later"
    return None


@functools.cache
def scaled_mm_works(device: torch.device) -> bool:
    """Whether this torch and GPU run ``torch._scaled_mm`` with per-row scales (checked once
    against the widened product); if not, products of several rows widen the weight."""
    try:
        x = torch.randn(3, 32, device=device, dtype=torch.bfloat16)
        w, s = quantize_fp8(torch.randn(16, 32, device=device))
        got = fp8_linear_scaled(x, w, s, None)
        want = F.linear(x.float(), dequantize_fp8(w, s, torch.float32))
        return bool((got.float() - want).abs().max() <= 0.1 * want.abs().max())
    except (RuntimeError, NotImplementedError, ValueError):
        return False


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``x`` in FP8, float32 scale per row [rows, 1]): each row scaled by its own largest
    magnitude; one Triton kernel on a GPU with Triton, torch's operations otherwise."""
    if x.is_cuda and x.stride(-1) == 1:
        from ..kernels.flashinfer_kernels import triton_unavailable_reason

        if triton_unavailable_reason() is None:
            from ..kernels.triton_kernels import quantize_rows_fp8

            return quantize_rows_fp8(x, FP8_MAX)
    amax = x.abs().amax(dim=1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear_scaled(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ dequantized(weight).T (+ bias)`` on the FP8 tensor cores: each row of ``x`` scaled
    to FP8 by its own largest magnitude, the float32 result scaled back by both scales."""
    x_fp8, x_scale = quantize_rows(x)
    out = torch._scaled_mm(
        x_fp8, weight.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype
    )
    return out if bias is None else out + bias


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """An FP8 projection of any number of rows (the one-row kernel handles batch-1 decode)."""
    if scaled_mm_works(x.device):
        return fp8_linear_scaled(x, weight, scale, bias)
    return F.linear(x, dequantize_fp8(weight, scale, x.dtype), bias)
