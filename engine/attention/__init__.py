from .base import AttentionBackend
from .torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "TorchAttentionBackend", "create_attention_backend"]


def create_attention_backend(name: str, *, dtype, device, **kwargs) -> AttentionBackend:
    """``name`` is the backend the engine settled on: ``flashinfer`` or ``torch``."""
    if name == "flashinfer":
        from .flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(dtype=dtype, device=device, **kwargs)
    return TorchAttentionBackend(**kwargs)
