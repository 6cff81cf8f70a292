"""Which attention a GPU engine can take: FlashInfer's prefill kernels serve head sizes that are
multiples of 64 only (a tiny model's 32 built, then failed at its first prompt on an H100), so
another size goes to the torch backend with its reason, before any kernel is built."""

import torch

from minisgl_engine.kernels.flashinfer_kernels import unavailable_reason


def test_flashinfer_is_refused_for_a_head_size_that_is_not_a_multiple_of_64() -> None:
    cuda = torch.device("cuda")
    for head_dim in (32, 80, 96):
        reason = unavailable_reason(cuda, torch.bfloat16, head_dim)
        assert reason is not None and "multiples of 64" in reason and str(head_dim) in reason
    for head_dim in (64, 128, 256):
        # here the reason, if any, is the missing package or GPU, never the head size
        reason = unavailable_reason(cuda, torch.bfloat16, head_dim)
        assert reason is None or "multiples of 64" not in reason
    assert "CUDA" in unavailable_reason(torch.device("cpu"), torch.bfloat16, 32)
