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
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
            rope_theta=500000.0,
        )
    if arch == "mistral":
        return MistralConfig(**TINY, head_dim=16, sliding_window=None)
    if arch == "qwen2":
        return Qwen2Config(**TINY)
    if arch == "qwen3":
        return Qwen3Config(
            **{**TINY, "num_key_value_heads": 1}, head_dim=32
        )  # head_dim != hidden/heads
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


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def hub_snapshot_dir(hub_cache: Path, repo_id: str) -> Path:
    """A snapshot folder in huggingface_hub's cache layout (models--org--name, refs/main), as a
    download leaves it: the models panel lists it as ``repo_id``."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def make_tiny_chat_model(
    hub_cache: Path, repo_id: str, tokenizer_dir: Path, drop: str | None = None
) -> Path:
    """A tiny random Llama model that speaks the demo model's tokenizer (same vocabulary, chat
    template and end token), written into a Hugging Face cache as ``repo_id``; ``drop`` leaves
    that tensor out of its weights (a model that fails to load)."""
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = hub_snapshot_dir(hub_cache, repo_id)
    config = LlamaConfig(
        **{
            **TINY,
            "vocab_size": 49152,
            "eos_token_id": 2,
            "bos_token_id": 1,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": True,
        },
        rope_theta=10000.0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    config.architectures = ["LlamaForCausalLM"]  # as a checkpoint's config.json says
    config.save_pretrained(folder)
    tensors = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight" and k != drop
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copyfile(tokenizer_dir / name, folder / name)
    return folder


def make_unsupported_model(hub_cache: Path, repo_id: str) -> Path:
    """A model folder of an architecture the engine does not implement (GPT-2), in the cache."""
    from safetensors.torch import save_file
    from transformers import GPT2Config

    folder = hub_snapshot_dir(hub_cache, repo_id)
    GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=320,
        bos_token_id=0,
        eos_token_id=0,
        architectures=["GPT2LMHeadModel"],
    ).save_pretrained(folder)
    save_file(
        {"wte.weight": torch.zeros(320, 32)},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder
