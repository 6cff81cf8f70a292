"""Host-to-device copies that never make the CPU wait for the GPU.

``torch.tensor(values, device="cuda")`` (or ``.to("cuda")`` of a pageable tensor) waits until
the GPU has finished everything queued before it. In the scheduler's loop that would stall
the CPU once per step, and overlap scheduling (preparing step N+1 while the GPU runs step N)
would gain nothing. A copy from pinned memory with ``non_blocking=True`` is queued instead.
"""

from __future__ import annotations

import array

import torch

# ``array`` type codes of the dtypes a step copies: ``array.array(code, values)`` reads a list of
# Python numbers ~3.5x faster than ``torch.tensor(values)`` (2.6 against 0.7 ms for the ~49,000
# numbers of an 8,192-token prefill step), and the tensor is made on its buffer without a copy
_ARRAY_CODES = {torch.int64: "q", torch.int32: "i", torch.float32: "f", torch.float64: "d"}
# Shorter lists keep torch.tensor: the gain there is a few us, and the batch-1 decode bench, whose
# step copies ~6 numbers, ran lower on the tree that built every list this way (1,069-1,211
# against 1,223-1,234 tok/s, docs/benchmarks.md, fourteenth round) for no reason found yet
ARRAY_FROM = 256


def host_tensor(values: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``values`` as a 1-D CPU tensor of ``dtype`` (``torch.tensor(values, dtype=dtype)``, faster
    for long lists)."""
    code = _ARRAY_CODES.get(dtype)
    if code is None or len(values) < ARRAY_FROM:
        return torch.tensor(values, dtype=dtype)
    try:
        return torch.frombuffer(array.array(code, values), dtype=dtype)
    except TypeError:  # e.g. floats for an integer dtype: torch.tensor's own conversion
        return torch.tensor(values, dtype=dtype)


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``, copied without waiting on a GPU."""
    tensor = host_tensor(values, dtype)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
