"""Where a short prefill's time goes with quantized weights: the Qwen3-8B shape (random weights)
prefills a 128-token prompt (the decode bench's first token) under each ``--quantization`` given,
and the torch profiler lists the costliest GPU kernels and CPU ops of one such prefill.

    python scripts/gpu_prefill_profile.py none int4 fp8
"""

from __future__ import annotations

import gc
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl_engine.llm import LLM
from minisgl_engine.sampling_params import SamplingParams


def main(kinds: list[str]) -> None:
    prompt = [[(7 * i) % 9000 + 10 for i in range(128)]]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for kind in kinds:
        llm = LLM(dummy_weights=True, config="qwen3-8b", device="cuda", quantization=kind)
        for _ in range(3):
            llm.generate(prompt, params)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            llm.generate(prompt, params)
        torch.cuda.synchronize()
        print(
            f"== {kind}: a 128-token prompt to its first token: {(time.perf_counter() - start) / 5 * 1000:.1f} ms"
        )
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            llm.generate(prompt, params)
            torch.cuda.synchronize()
        print(
            prof.key_averages().table(
                sort_by="cuda_time_total", row_limit=12, max_name_column_width=70
            )
        )
        print(
            prof.key_averages().table(
                sort_by="cpu_time_total", row_limit=8, max_name_column_width=70
            )
        )
        del llm
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["none", "int4", "fp8"])
