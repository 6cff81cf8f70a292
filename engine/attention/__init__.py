from .base import AttentionBackend
from .torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "TorchAttentionBackend", "create_attention_backend"]


def create_attention_backend(name: str, device, **kwargs) -> AttentionBackend:
    """``auto`` picks the best backend for the device; only ``torch`` exists on CPU."""
    if name not in ("auto", "torch"):
        from ..errors import UserError

        raise UserError(f"attention backend {name!r} is not available here (use --attn torch)")
    return TorchAttentionBackend(**kwargs)
