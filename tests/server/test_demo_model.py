"""The converted demo model on disk (CI pulls it before the tests; skipped when absent)."""

from __future__ import annotations

import json
import subprocess

import pytest

from minisgl_engine.weights import demo
from minisgl_engine.weights.gguf_convert import is_complete

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_dir():
    folder = demo.demo_model_dir()
    if not is_complete(folder):
        pytest.skip(
            f"demo model not pulled into {folder}; run "
            "`python -c 'from minisgl_engine.weights.demo import pull_demo; pull_demo()'`"
        )
    return folder


def test_demo_folder_contents(demo_dir) -> None:
    config = json.loads((demo_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    assert config["tie_word_embeddings"] is True
    # the weights stay in the GGUF file, quantized (no float32 copy on disk)
    assert (demo_dir / "model.gguf").stat().st_size == demo.DEMO_GGUF_SIZE
    assert not (demo_dir / "model.safetensors").exists()
    assert (demo_dir / "tokenizer.json").is_file()
    assert (demo_dir / "tokenizer_config.json").is_file()
    assert (demo_dir / "chat_template.jinja").is_file()


def test_demo_weights_names(demo_dir) -> None:
    from minisgl_engine.weights.gguf_tensors import GGUFTensor, iter_gguf

    tensors = dict(iter_gguf(demo_dir / "model.gguf"))
    assert "model.embed_tokens.weight" in tensors
    assert "lm_head.weight" not in tensors  # tied to the embeddings
    assert len(tensors) == 272
    kinds = {
        name: tensor.type_name for name, tensor in tensors.items() if isinstance(tensor, GGUFTensor)
    }
    assert kinds["model.embed_tokens.weight"] == "Q8_0"
    assert sorted(set(kinds.values())) == ["Q4_1", "Q8_0"] and len(kinds) == 211


def test_second_pull_does_not_download(demo_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pip(*args, **kwargs):
        raise AssertionError("pull_demo ran a subprocess although the model is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert demo.pull_demo(progress=False) == demo_dir
