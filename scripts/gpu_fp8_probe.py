"""--quantization fp8's products timed alone on the GPU, at the Qwen3-8B shapes: the FP8
tensor-core product (layers/fp8.py) against bf16 cuBLAS at 1-2,048 rows, and the one-row
kernel's plans on FP8 weights against bf16 (also with a K tile twice as long for FP8's bytes).
    python scripts/gpu_fp8_probe.py
"""

import torch
import torch.nn.functional as F

from minisgl_engine.kernels import triton_kernels as tk
from minisgl_engine.kernels.fused_ops import gpu_time_us
from minisgl_engine.layers import fp8

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


def main() -> None:
    dev = torch.device("cuda")
    print(
        "scaled_mm_works:",
        fp8.scaled_mm_works(dev),
        torch.__version__,
        torch.cuda.get_device_name(),
    )
    for name, (n, k) in SHAPES.items():
        w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        w8, s = fp8.quantize_fp8(w16)
        for rows in (1, 16, 128, 2048):
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            bf16 = gpu_time_us(lambda: F.linear(x, w16))
            scaled = gpu_time_us(lambda: fp8.fp8_linear_scaled(x, w8, s, None))
            widened = gpu_time_us(lambda: F.linear(x, fp8.dequantize_fp8(w8, s, x.dtype)))
            print(
                f"{name} {n}x{k} rows {rows}: bf16 {bf16:.1f} us, fp8 scaled_mm {scaled:.1f} us, widened {widened:.1f} us"
            )
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        bound16, bound8 = n * k * 2 / 3.35e6, n * k / 3.35e6  # us at H100's 3.35 TB/s
        for tile in (8192, 16384, 32768):
            tk.GEMV_TILE_ELEMENTS = tile
            for plan in ((4, 0), (8, 0), (16, 0), (1, 4), (2, 4)):
                if not plan[1] and tk.gemv_block_k(k, plan[0]) is None:
                    continue
                try:
                    t16 = gpu_time_us(lambda: tk.gemv(x, w16, block_n=plan[0], per_sm=plan[1]))
                    t8 = gpu_time_us(
                        lambda: tk.gemv(x, w8, block_n=plan[0], per_sm=plan[1], scale=s)
                    )
                except Exception as exc:  # noqa: BLE001
                    print(f"  tile {tile} plan {plan}: {type(exc).__name__} {str(exc)[:120]}")
                    continue
                print(
                    f"  gemv tile {tile} plan {plan}: bf16 {t16:.1f} us (bound {bound16:.1f}), fp8 {t8:.1f} us (bound {bound8:.1f})"
                )
        tk.GEMV_TILE_ELEMENTS = 8192


if __name__ == "__main__":
    main()
