"""A model's ``config.json``: read by transformers (``load_hf_config``, the scheduler's model
loader), or straight into :class:`ModelConfig` (``read_model_config``, the front end's check of
a model before its workers start), which takes milliseconds instead of the seconds importing
transformers' configuration classes costs.

The direct reading is used only when the file spells out every number :meth:`ModelConfig.from_hf`
reads whose default differs between transformers' model classes (the end-of-sequence id, the KV
head count, Mistral's sliding window …); any other file is read by transformers, so both readings
give the same ``ModelConfig`` (tests/unit/test_hf_config.py compares them).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .config import SUPPORTED_MODEL_TYPES, EngineConfig, ModelConfig
from .errors import ModelSourceError, UserError

SPELLED_OUT = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "eos_token_id",
)
"""Fields of config.json that must be there to read it without transformers."""


def builtin_config_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".json")
        for p in resources.files("minisgl_engine.configs").iterdir()
        if p.name.endswith(".json")
    )


def config_data(config: EngineConfig, model_dir: Path | None) -> dict[str, Any]:
    """The config as a dict: a built-in shape for --dummy-weights --config NAME, else the model
    folder's config.json."""
    if config.config is not None:
        names = builtin_config_names()
        if config.config not in names:
            raise UserError(
                f"unknown --config {config.config!r}; built-in configs: {', '.join(names)}"
            )
        text = resources.files("minisgl_engine.configs").joinpath(f"{config.config}.json")
        return json.loads(text.read_text())
    assert model_dir is not None
    return json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))


def load_hf_config(config: EngineConfig, model_dir: Path | None):
    """The transformers config object: a built-in shape for --dummy-weights --config NAME, else
    the model folder's config.json."""
    from transformers import AutoConfig

    if config.config is not None:
        data = config_data(config, None)
        cls = AutoConfig.for_model(data["model_type"]).__class__
        return cls.from_dict(data)
    assert model_dir is not None
    try:
        return AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError) as exc:
        raise ModelSourceError(
            f"cannot read {model_dir / 'config.json'}: {str(exc).splitlines()[0]}"
        ) from None


def rope_parameters(data: dict[str, Any]) -> dict[str, Any] | None:
    """RoPE's theta and scaling as transformers 5 gathers them (``rope_parameters``), None when
    the file leaves theta to a model class's default."""
    given = data.get("rope_parameters")
    if given:
        return dict(given) if "rope_theta" in given else None
    if "rope_theta" not in data:
        return None
    rope = dict(data.get("rope_scaling") or {})
    rope["rope_theta"] = data["rope_theta"]
    rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    return rope


def spelled_out(data: dict[str, Any]) -> SimpleNamespace | None:
    """``data`` as the attributes ``ModelConfig.from_hf`` reads, or None when transformers'
    defaults would fill some of them in."""
    if data.get("model_type") not in SUPPORTED_MODEL_TYPES:
        return None
    if any(key not in data for key in SPELLED_OUT):
        return None
    if data["model_type"] == "mistral" and "sliding_window" not in data:
        return None
    rope = rope_parameters(data)
    if rope is None:
        return None
    return SimpleNamespace(
        **{**data, "rope_parameters": rope, "dtype": data.get("dtype") or data.get("torch_dtype")}
    )


def read_model_config(config: EngineConfig, model_dir: Path | None) -> ModelConfig:
    """The model's shape from its config, without transformers where the file allows."""
    try:
        data = config_data(config, model_dir)
    except (OSError, ValueError):
        data = {}  # transformers reads it again and says what is wrong
    attrs = spelled_out(data) if isinstance(data, dict) else None
    if attrs is None:
        return ModelConfig.from_hf(load_hf_config(config, model_dir))
    return ModelConfig.from_hf(attrs)


def generation_eos_token_ids(model_dir: Path) -> list[int]:
    """The end-of-sequence ids ``generation_config.json`` lists (chat models often list several
    there), as transformers' GenerationConfig reads them; none without the file."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if eos is None:
        return []
    return [int(token) for token in eos] if isinstance(eos, list) else [int(eos)]
