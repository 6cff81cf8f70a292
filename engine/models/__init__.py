"""Model registry: every supported ``model_type`` maps to one implementation in this package."""

from ..config import ModelConfig
from .transformer import CausalLM

__all__ = ["CausalLM", "build_model"]


def build_model(config: ModelConfig, dtype) -> CausalLM:
    # Llama, Mistral, Qwen2 and Qwen3 share one implementation whose blocks read the config's
    # flags (attention_bias, qk_norm, rope_scaling); see transformer.py.
    return CausalLM(config, dtype)
