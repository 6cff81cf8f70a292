"""A model that cannot fit is refused before anything is allocated, in one line."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from minisgl_engine import model_loader
from minisgl_engine.config import EngineConfig
from minisgl_engine.errors import UserError


def test_8b_in_float32_does_not_fit_24_gib(monkeypatch):
    monkeypatch.setattr(model_loader, "free_memory_bytes", lambda device: 24 << 30)
    with pytest.raises(UserError) as err:
        model_loader.load_model(EngineConfig(dummy_weights=True, config="qwen3-8b", dtype="float32", device="cpu"))
    msg = str(err.value)
    assert "\n" not in msg and "GiB" in msg and "smaller" in msg


def test_param_bytes_matches_the_real_model_size():
    """Qwen3-0.6B has 596M parameters with its tied embedding (0.44B without it)."""
    from minisgl_engine.config import ModelConfig

    hf = model_loader.load_hf_config(EngineConfig(config="qwen3-0.6b"), None)
    n = model_loader.param_bytes(ModelConfig.from_hf(hf), __import__("torch").float32) // 4
    assert 590e6 < n < 600e6, n


@pytest.mark.skipif(psutil.virtual_memory().available > 30 << 30, reason="this machine could hold an 8B model in float32")
def test_cli_exits_2_when_the_model_does_not_fit():
    proc = subprocess.run(
        [sys.executable, "-m", "minisgl_app.cli", "generate", "--dummy-weights", "--config", "qwen3-8b", "--dtype", "float32", "--device", "cpu", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "GiB" in proc.stderr
