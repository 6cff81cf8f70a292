from .base import AttentionBackend
from .torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "TorchAttentionBackend", "create_attention_backend"]


def create_attention_backend(
    name: str, *, dtype, device, triton_decode: bool = True, **kwargs
) -> AttentionBackend:
    """``name`` is the backend the engine settled on: ``flashinfer`` or ``torch``.
    ``triton_decode``: FlashInfer's small decode graphs may attend with the Triton kernels."""
    if name == "flashinfer":
        from .flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(
            dtype=dtype, device=device, triton_decode=triton_decode, **kwargs
        )
    return TorchAttentionBackend(**kwargs)
