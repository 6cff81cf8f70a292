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
        pytest.skip(f"demo model not pulled into {folder}; run "
                    "`python -c 'from minisgl_engine.weights.demo import pull_demo; pull_demo()'`")
    return folder


def test_demo_folder_contents(demo_dir) -> None:
    config = json.loads((demo_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30, 576, 49152)
    assert config["tie_word_embeddings"] is True
    assert (demo_dir / "model.safetensors").stat().st_size > 500_000_000
    assert (demo_dir / "tokenizer.json").is_file()
    assert (demo_dir / "tokenizer_config.json").is_file()
    assert (demo_dir / "chat_template.jinja").is_file()


def test_demo_weights_names(demo_dir) -> None:
    from safetensors import safe_open

    with safe_open(str(demo_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names
    assert "lm_head.weight" not in names  # tied to the embeddings
    assert len(names) == 272


def test_second_pull_does_not_download(demo_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pip(*args, **kwargs):
        raise AssertionError("pull_demo ran a subprocess although the model is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert demo.pull_demo(progress=False) == demo_dir
