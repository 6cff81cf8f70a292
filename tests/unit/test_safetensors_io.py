"""safetensors reading: single file, shards with an index, and the ways files go wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from minisgl_engine.errors import UserError, WeightsError
from minisgl_engine.weights.safetensors_io import iter_safetensors, weights_nbytes


def _tensors() -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "norm.weight": torch.ones(4, dtype=torch.bfloat16),
        "positions": torch.arange(5, dtype=torch.int64),
    }


def _sharded(folder: Path) -> dict[str, torch.Tensor]:
    tensors = _tensors()
    shards = {
        "model-00001-of-00002.safetensors": ["embed.weight"],
        "model-00002-of-00002.safetensors": ["norm.weight", "positions"],
    }
    for shard, names in shards.items():
        save_file({n: tensors[n] for n in names}, str(folder / shard))
    weight_map = {n: shard for shard, names in shards.items() for n in names}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    return tensors


def _assert_one_line(exc: pytest.ExceptionInfo, *needles: str) -> None:
    message = str(exc.value)
    assert isinstance(exc.value, UserError)
    assert "\n" not in message and message
    for needle in needles:
        assert needle in message


def test_single_file(tmp_path: Path) -> None:
    tensors = _tensors()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = dict(iter_safetensors(tmp_path))
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor)


def test_sharded_with_index(tmp_path: Path) -> None:
    tensors = _sharded(tmp_path)
    loaded = dict(iter_safetensors(tmp_path))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())


def test_each_shard_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minisgl_engine.weights import safetensors_io

    _sharded(tmp_path)
    opened: list[str] = []
    real = safetensors_io.safe_open

    def counting(path: str, framework: str):
        opened.append(Path(path).name)
        return real(path, framework=framework)

    monkeypatch.setattr(safetensors_io, "safe_open", counting)
    assert len(list(iter_safetensors(tmp_path))) == 3
    assert sorted(opened) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_truncated_file(tmp_path: Path) -> None:
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-10])
    with pytest.raises(WeightsError) as exc:
        list(iter_safetensors(tmp_path))
    _assert_one_line(exc, "model.safetensors")


def test_garbage_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(WeightsError) as exc:
        list(iter_safetensors(tmp_path))
    _assert_one_line(exc, "model.safetensors")
    with pytest.raises(WeightsError) as exc:
        weights_nbytes(tmp_path, None)
    _assert_one_line(exc, "model.safetensors")


def test_missing_shard(tmp_path: Path) -> None:
    _sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsError) as exc:
        list(iter_safetensors(tmp_path))
    _assert_one_line(exc, "model-00002-of-00002.safetensors")


def test_no_weights_and_missing_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(WeightsError) as exc:
        list(iter_safetensors(tmp_path))
    _assert_one_line(exc, str(tmp_path))
    with pytest.raises(WeightsError) as exc:
        weights_nbytes(tmp_path / "nope", None)
    _assert_one_line(exc, "nope")


def test_bad_index(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(WeightsError) as exc:
        list(iter_safetensors(tmp_path))
    _assert_one_line(exc, "model.safetensors.index.json")


@pytest.mark.parametrize("sharded", [False, True])
def test_weights_nbytes(tmp_path: Path, sharded: bool) -> None:
    if sharded:
        _sharded(tmp_path)
    else:
        save_file(_tensors(), str(tmp_path / "model.safetensors"))
    # 12 float32 + 4 bfloat16 + 5 int64 (integers are never cast)
    assert weights_nbytes(tmp_path, None) == 12 * 4 + 4 * 2 + 5 * 8
    assert weights_nbytes(tmp_path, torch.bfloat16) == 16 * 2 + 5 * 8
    assert weights_nbytes(tmp_path, torch.float32) == 16 * 4 + 5 * 8
    assert weights_nbytes(tmp_path, torch.float64) == 16 * 8 + 5 * 8


def test_lazy_slices_read_only_the_chosen_block(tmp_path):
    """A tensor-parallel rank narrows a lazy checkpoint tensor and reads just that block."""
    from safetensors.torch import save_file

    from minisgl_engine.weights.safetensors_io import LazySlice, iter_safetensors, read_tensor

    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    bias = torch.arange(8, dtype=torch.float32)
    save_file({"w": full, "b": bias}, str(tmp_path / "model.safetensors"))
    seen = {}
    for name, lazy in iter_safetensors(tmp_path, lazy=True):
        assert isinstance(lazy, LazySlice)
        if name == "w":
            block = lazy.narrow(0, 4, 4).narrow(1, 2, 3)
            assert block.shape == (4, 3)
            seen[name] = (read_tensor(block), read_tensor(lazy[2:5]))
        else:
            seen[name] = (read_tensor(lazy.narrow(0, 1, 2)), read_tensor(lazy))
    assert torch.equal(seen["w"][0], full[4:8, 2:5]) and torch.equal(seen["w"][1], full[2:5])
    assert torch.equal(seen["b"][0], bias[1:3]) and torch.equal(seen["b"][1], bias)
