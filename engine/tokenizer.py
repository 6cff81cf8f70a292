"""Loading a model's tokenizer (transformers' fast tokenizers and chat templates), kept apart
from the engine so that tokenizer processes start without loading the model code."""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path):
    """The folder's tokenizer, or None when it ships none (e.g. a weights-only test model)."""
    from transformers import AutoTokenizer

    if not any((Path(path) / name).exists() for name in TOKENIZER_FILES):
        return None
    return AutoTokenizer.from_pretrained(path)
