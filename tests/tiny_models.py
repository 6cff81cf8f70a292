"""Tiny random Hugging Face models of each supported architecture, saved as real checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    eos_token_id=1,
    bos_token_id=0,
)

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


def tiny_config(arch: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if arch == "llama":
        return LlamaConfig(**TINY, rope_theta=10000.0)
    if arch == "llama3":  # Llama 3 rope scaling, tied embeddings (like SmolLM2 / Llama 3.2)
        kw = {**TINY, "tie_word_embeddings": True}
        return LlamaConfig(
            **kw,
            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
            rope_theta=500000.0,
        )
    if arch == "mistral":
        return MistralConfig(**TINY, head_dim=16, sliding_window=None)
    if arch == "qwen2":
        return Qwen2Config(**TINY)
    if arch == "qwen3":
        return Qwen3Config(**{**TINY, "num_key_value_heads": 1}, head_dim=32)  # head_dim != hidden/heads
    raise ValueError(arch)


def make_tiny_model(arch: str, folder: Path, seed: int = 0):
    """Save a random float32 model to ``folder`` and return the transformers model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32)
    with torch.no_grad():  # larger-than-default weights give logits with real spread
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif "bias" in name:
                p.normal_(0, 0.1)
            else:
                p.normal_(0, 0.08)
    model.eval()
    model.save_pretrained(folder)
    return model
