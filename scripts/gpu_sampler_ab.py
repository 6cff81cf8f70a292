"""A sampled decode step's draw at the offline workload's batch sizes (152k vocabulary, float32
logits, temperature 0.6): the Gumbel-max kernel the engine runs (``triton_kernels.gumbel_sample``)
against dividing by the temperature and FlashInfer's ``sampling_from_logits`` (the engine's way
before). Run on the device through ``scripts/gpu_check.sh samplerab``; each timing is one CUDA
graph of 20 calls replayed 20 times (scripts/gpu_timing.py)."""

from __future__ import annotations

import flashinfer
import torch
from gpu_timing import graph_us

from minisgl_engine.kernels.triton_kernels import gumbel_sample

VOCAB = 151_936

for rows in (16, 64, 128, 256):
    logits = torch.randn(rows, VOCAB, device="cuda", dtype=torch.float32)
    temps = torch.full((rows,), 0.6, device="cuda")
    gumbel = graph_us(lambda: gumbel_sample(logits, temps, 1234))
    before = graph_us(lambda: flashinfer.sampling.sampling_from_logits(logits / temps.unsqueeze(1)))
    read_us = rows * VOCAB * 4 / 4.24e6  # the logits read once at the copy bandwidth
    print(
        f"rows {rows:3d}: Gumbel-max kernel {gumbel:7.1f} us, divide + FlashInfer {before:7.1f} us, "
        f"one read of the logits at 4.24 TB/s {read_us:6.1f} us",
        flush=True,
    )
