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
        model_loader.load_model(
            EngineConfig(dummy_weights=True, config="qwen3-8b", dtype="float32", device="cpu")
        )
    msg = str(err.value)
    assert "\n" not in msg and "GiB" in msg and "smaller" in msg


def test_param_bytes_matches_the_real_model_size():
    """Qwen3-0.6B has 596M parameters with its tied embedding (0.44B without it)."""
    from minisgl_engine.config import ModelConfig

    hf = model_loader.load_hf_config(EngineConfig(config="qwen3-0.6b"), None)
    n = model_loader.param_bytes(ModelConfig.from_hf(hf), __import__("torch").float32) // 4
    assert 590e6 < n < 600e6, n


@pytest.mark.skipif(
    psutil.virtual_memory().available > 30 << 30,
    reason="this machine could hold an 8B model in float32",
)
def test_cli_exits_2_when_the_model_does_not_fit():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "minisgl_app.cli",
            "generate",
            "--dummy-weights",
            "--config",
            "qwen3-8b",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "hi",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "GiB" in proc.stderr


def test_a_model_too_big_for_one_gpu_names_the_tp_that_fits(monkeypatch):
    """70 GiB of weights on GPUs with 40 GiB free each: --tp 2 would fit; on a machine of one GPU
    the message says so too."""
    import torch

    monkeypatch.setattr(model_loader, "free_memory_bytes", lambda device: 40 << 30)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError) as err:
        model_loader.check_fits("big", 70 << 30, 1 << 30, torch.device("cuda"), torch.bfloat16)
    msg = str(err.value)
    assert "\n" not in msg and "--tp 2 would fit" in msg and "this machine has them" in msg, msg
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError) as err:
        model_loader.check_fits(
            "big", 150 << 30, 1 << 30, torch.device("cuda"), torch.bfloat16, tp=2
        )
    msg = str(err.value)
    assert (
        "--tp 4 would fit" in msg and "this machine has 1" in msg and "1/2 share with --tp 2" in msg
    ), msg
    model_loader.check_fits(
        "big", 70 << 30, 1 << 30, torch.device("cuda"), torch.bfloat16, tp=2
    )  # fits: no error


def test_a_model_too_big_for_the_gpu_in_16_bits_names_the_quantization_that_fits(monkeypatch):
    """Qwen3-8B on a GPU with 10 GiB free: its 15.3 GiB of bf16 weights do not fit; held as 8-bit
    codes (9.1 GiB) or 4-bit (5.6 GiB) they would, and the message names both with their sizes."""
    import torch

    from minisgl_engine.config import ModelConfig

    hf = model_loader.load_hf_config(EngineConfig(config="qwen3-8b"), None)
    config = ModelConfig.from_hf(hf)
    sizes = {
        kind: model_loader.param_bytes(config, torch.bfloat16, kind)
        for kind in ("none", "fp8", "int8", "int4")
    }
    gib = {kind: round(n / 2**30, 1) for kind, n in sizes.items()}
    # the figures the engine reported holding on an H100 (bench JSON weight_gib): 15.256, 5.565
    assert gib["none"] == 15.3 and gib["int4"] == 5.6 and gib["int8"] == 9.1 and gib["fp8"] == 8.8
    monkeypatch.setattr(model_loader, "free_memory_bytes", lambda device: 10 << 30)
    quantized = {kind: sizes[kind] for kind in ("fp8", "int8", "int4")}
    with pytest.raises(UserError) as err:
        model_loader.check_fits(
            "qwen3-8b", sizes["none"], 1 << 29, torch.device("cuda"), torch.bfloat16, 1, quantized
        )
    msg = str(err.value)
    assert "\n" not in msg and "15.3 GiB of weights" in msg, msg
    assert (
        "--quantization fp8 (8.8 GiB of weights) or --quantization int8 (9.1 GiB of weights) or "
        "--quantization int4 (5.6 GiB of weights) would fit it" in msg
    ), msg
    monkeypatch.setattr(model_loader, "free_memory_bytes", lambda device: 7 << 30)
    with pytest.raises(UserError, match=r"--quantization int4 \(5.6 GiB of weights\) would fit"):
        model_loader.check_fits(
            "qwen3-8b", sizes["none"], 1 << 29, torch.device("cuda"), torch.bfloat16, 1, quantized
        )


def test_quantization_gguf_keeps_a_ggufs_blocks_and_refuses_other_checkpoints():
    """``--quantization gguf``: a GGUF's blocks kept (on CPU, where ``auto`` keeps them too);
    asked of a float checkpoint it says what to use instead."""
    import torch

    cpu = torch.device("cpu")
    assert (
        model_loader.choose_quantization(EngineConfig(quantization="gguf"), cpu, "gguf") == "gguf"
    )
    assert (
        model_loader.choose_quantization(EngineConfig(quantization="auto"), cpu, "gguf") == "gguf"
    )
    assert model_loader.choose_quantization(EngineConfig(quantization="auto"), cpu) == "none"
    with pytest.raises(UserError, match="no GGUF; use int4, int8 or fp8"):
        model_loader.choose_quantization(EngineConfig(quantization="gguf"), cpu)


def test_a_gguf_too_big_for_the_gpu_widened_names_keeping_its_blocks(monkeypatch):
    import torch

    monkeypatch.setattr(model_loader, "free_memory_bytes", lambda device: 6 << 30)
    with pytest.raises(UserError, match=r"--quantization gguf \(4.9 GiB of weights\) would fit"):
        model_loader.check_fits(
            "a 8B GGUF",
            15 << 30,
            1 << 29,
            torch.device("cuda"),
            torch.bfloat16,
            1,
            {"fp8": 8 << 30, "gguf": int(4.9 * 2**30)},
        )
