"""Host-to-device copies that never make the CPU wait for the GPU.

``torch.tensor(values, device="cuda")`` (or ``.to("cuda")`` of a pageable tensor) waits until
the GPU has finished everything queued before it. In the scheduler's loop that would stall
the CPU once per step, and overlap scheduling (preparing step N+1 while the GPU runs step N)
would gain nothing. A copy from pinned memory with ``non_blocking=True`` is queued instead.
"""

from __future__ import annotations

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``, copied without waiting on a GPU."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
