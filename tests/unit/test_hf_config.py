"""The front end reads a model's config.json without transformers; it must come to the same
``ModelConfig`` as transformers' reading (which the scheduler's model loader uses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tiny_models import ARCHS, tiny_config

from minisgl_engine.config import EngineConfig, ModelConfig
from minisgl_engine.hf_config import builtin_config_names, load_hf_config, read_model_config

LLAMA3_AS_ON_THE_HUB = {  # transformers 4's spelling: rope_scaling beside rope_theta
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

QWEN3_AS_ON_THE_HUB = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "sliding_window": None,
    "use_sliding_window": False,
    "attention_bias": False,
    "eos_token_id": 151645,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

MISTRAL_AS_ON_THE_HUB = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "vocab_size": 32768,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "sliding_window": 4096,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def both(folder=None, config: EngineConfig | None = None) -> tuple[ModelConfig, ModelConfig]:
    """(transformers' reading, ours)."""
    config = config or EngineConfig(model=str(folder))
    return ModelConfig.from_hf(load_hf_config(config, folder)), read_model_config(config, folder)


def written(tmp_path, data: dict):
    (tmp_path / "config.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("arch", ARCHS)
def test_configs_saved_by_transformers(tmp_path, arch):
    tiny_config(arch).save_pretrained(tmp_path)
    reference, ours = both(tmp_path)
    assert ours == reference


@pytest.mark.parametrize(
    "data",
    [LLAMA3_AS_ON_THE_HUB, QWEN3_AS_ON_THE_HUB, MISTRAL_AS_ON_THE_HUB],
    ids=["llama3", "qwen3", "mistral"],
)
def test_configs_as_the_hub_writes_them(tmp_path, data):
    reference, ours = both(written(tmp_path, data))
    assert ours == reference


@pytest.mark.parametrize("name", builtin_config_names())
def test_the_built_in_shapes(name):
    reference, ours = both(None, EngineConfig(config=name, dummy_weights=True))
    assert ours == reference


@pytest.mark.parametrize(
    "missing",
    ["eos_token_id", "num_key_value_heads", "rope_theta", "max_position_embeddings"],
)
def test_fields_left_to_transformers_defaults(tmp_path, missing):
    """A file that leaves a number to a model class's default is read by transformers."""
    data = {k: v for k, v in MISTRAL_AS_ON_THE_HUB.items() if k != missing}
    reference, ours = both(written(tmp_path, data))
    assert ours == reference


def test_mistral_without_its_window_and_the_demo_model(tmp_path):
    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    data = {k: v for k, v in MISTRAL_AS_ON_THE_HUB.items() if k != "sliding_window"}
    reference, ours = both(written(tmp_path, data))
    assert ours == reference and ours.max_context_len == 4096  # the class's default window
    if is_complete(demo_model_dir()):
        reference, ours = both(demo_model_dir())
        assert ours == reference


def test_reading_a_spelled_out_config_imports_no_transformers(tmp_path):
    folder = written(tmp_path, QWEN3_AS_ON_THE_HUB)
    code = (
        "import sys\n"
        "from minisgl_engine.config import EngineConfig\n"
        "from minisgl_engine.hf_config import read_model_config\n"
        f"c = read_model_config(EngineConfig(model={str(folder)!r}), __import__('pathlib').Path({str(folder)!r}))\n"
        "assert c.num_layers == 28\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("eos", [2, [128001, 128009], None], ids=["one", "several", "none"])
def test_generation_config_end_ids_as_transformers_reads_them(tmp_path, eos):
    from transformers import GenerationConfig

    from minisgl_engine.hf_config import generation_eos_token_ids

    (tmp_path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": eos, "do_sample": False})
    )
    theirs = GenerationConfig.from_pretrained(tmp_path).eos_token_id
    expected = theirs if isinstance(theirs, list) else [] if theirs is None else [theirs]
    assert generation_eos_token_ids(tmp_path) == expected
    assert generation_eos_token_ids(tmp_path / "elsewhere") == []
