"""The MINISGL_* switches read from the environment (engine/env.py): a bad value is an error
that names what to write, never a silent fallback to the default."""

import pytest

from minisgl_engine.env import env_choice, env_ints


def test_env_ints_reads_its_fields_and_refuses_anything_else(monkeypatch) -> None:
    fields, default = ("block_n", "warps", "stages", "programs"), (64, 4, 3, 4)
    monkeypatch.delenv("MINISGL_TEST_TILES", raising=False)
    assert env_ints("MINISGL_TEST_TILES", fields, default) == default
    monkeypatch.setenv("MINISGL_TEST_TILES", " 32, 2,2 ,8 ")
    assert env_ints("MINISGL_TEST_TILES", fields, default) == (32, 2, 2, 8)
    for bad in ("32,2,2", "32,2,2,8,1", "32,2,0,8", "32,two,2,8", "-1,2,2,8"):
        monkeypatch.setenv("MINISGL_TEST_TILES", bad)
        with pytest.raises(ValueError, match="block_n,warps,stages,programs"):
            env_ints("MINISGL_TEST_TILES", fields, default)


def test_env_choice_takes_the_first_choice_when_unset_and_refuses_others(monkeypatch) -> None:
    monkeypatch.delenv("MINISGL_TEST_MODE", raising=False)
    assert env_choice("MINISGL_TEST_MODE", ("auto", "on")) == "auto"
    monkeypatch.setenv("MINISGL_TEST_MODE", "ON")
    assert env_choice("MINISGL_TEST_MODE", ("auto", "on")) == "on"
    monkeypatch.setenv("MINISGL_TEST_MODE", "sometimes")
    with pytest.raises(ValueError, match="auto, on"):
        env_choice("MINISGL_TEST_MODE", ("auto", "on"))


def test_flashinfer_decode_takes_the_tensor_cores_by_group_size_unless_told(monkeypatch) -> None:
    """MINISGL_DECODE_TENSOR_CORES: auto (2+ query heads per KV head over a 16-bit pool, 4+ over
    an FP8 one: what ran faster on an H200, docs/benchmarks.md, twelfth round), on or off."""
    import torch

    from minisgl_engine.attention.flashinfer_backend import decode_uses_tensor_cores

    monkeypatch.delenv("MINISGL_DECODE_TENSOR_CORES", raising=False)
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    assert [
        decode_uses_tensor_cores(16, 16, bf16),
        decode_uses_tensor_cores(16, 8, bf16),
        decode_uses_tensor_cores(32, 8, bf16),
    ] == [False, True, True]
    assert [decode_uses_tensor_cores(16, 8, fp8), decode_uses_tensor_cores(32, 8, fp8)] == [
        False,
        True,
    ]
    assert decode_uses_tensor_cores(16, 8), "no pool named: a 16-bit one"
    monkeypatch.setenv("MINISGL_DECODE_TENSOR_CORES", "on")
    assert decode_uses_tensor_cores(16, 8)
    monkeypatch.setenv("MINISGL_DECODE_TENSOR_CORES", "off")
    assert not decode_uses_tensor_cores(32, 8)
    monkeypatch.setenv("MINISGL_DECODE_TENSOR_CORES", "always")
    with pytest.raises(ValueError, match="auto, on, off"):
        decode_uses_tensor_cores(16, 8)
