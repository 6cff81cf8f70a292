import torch
import torch.nn.functional as F


def silu_and_mul(gate_up: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """SwiGLU: the merged gate/up projection's output is ``[gate | up]``. ``fused`` runs
    FlashInfer's one-kernel version (CUDA)."""
    if fused:
        import flashinfer

        return flashinfer.activation.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
