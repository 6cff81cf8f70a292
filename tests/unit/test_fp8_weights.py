"""--quantization fp8's CPU-checkable parts: the per-row scaling, and the refusal off a GPU.
(The kernels and the engine's agreement run on the device: tests/gpu.)"""

import pytest
import torch

from minisgl_engine.config import EngineConfig
from minisgl_engine.errors import UserError
from minisgl_engine.layers.fp8 import FP8, FP8_MAX, dequantize_fp8, quantize_fp8
from minisgl_engine.model_loader import choose_quantization


def test_each_row_is_scaled_to_fp8s_range_and_comes_back_within_its_rounding():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 128, generator=gen) * torch.logspace(-3, 2, 64)[:, None]
    weight[5] = 0  # a zero row keeps scale 1 (no division by zero)
    fp8, scale = quantize_fp8(weight.to(torch.bfloat16))
    assert fp8.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (64,)
    assert torch.equal(
        fp8.float().abs().amax(dim=1)[torch.arange(64) != 5], torch.full((63,), FP8_MAX)
    )
    assert scale[5] == 1 and not fp8[5].float().any()
    back = dequantize_fp8(fp8, scale, torch.float32)
    # e4m3 keeps 3 mantissa bits: each weight within half a step (2^-4 relative) of its row's
    # bf16 value, or within the smallest normal step for the row's tiny values
    ref = weight.to(torch.bfloat16).float()
    tolerance = ref.abs() * 2**-4 + scale[:, None] * 2**-9
    assert ((back - ref).abs() <= tolerance).all()


def test_fp8_weights_are_refused_on_the_cpu_with_what_to_use():
    with pytest.raises(UserError, match="--quantization fp8: FP8 weights run on an NVIDIA GPU"):
        choose_quantization(EngineConfig(quantization="fp8"), torch.device("cpu"))
