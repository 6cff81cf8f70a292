"""The CUDA graph batch sizes (pure Python: runs without a GPU)."""

from minisgl_engine.cuda_graph import capture_sizes


def test_capture_sizes_cover_every_batch_with_little_padding():
    for max_bs in (1, 3, 8, 64, 100, 256, 300):
        sizes = capture_sizes(max_bs)
        assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_bs
        for bs in range(1, max_bs + 1):
            padded = min(s for s in sizes if s >= bs)
            # the graph's spacing where bs falls: 1, 2, 4, 8; then every 8 to 64, 16 to 256, 32 beyond
            step = 4 if bs <= 8 else 8 if bs <= 64 else 16 if bs <= 256 else 32
            assert padded - bs < step, (max_bs, bs, padded)
    assert len(capture_sizes(256)) <= 24


def test_small_decode_graphs_attend_with_triton_up_to_the_limits(monkeypatch):
    """Which decode graphs are captured, and which one a step replays, at the edges of the
    limits; a mistyped MINISGL_DECODE_ATTENTION is an error naming the choices."""
    import pytest

    from minisgl_engine.attention import flashinfer_backend as fb
    from minisgl_engine.attention.flashinfer_backend import TRITON_DECODE_MAX_BATCH as ROWS
    from minisgl_engine.attention.flashinfer_backend import TRITON_DECODE_MAX_CONTEXT as TOKENS
    from minisgl_engine.attention.flashinfer_backend import DecodeAttentionLimits

    monkeypatch.setattr(fb, "triton_unavailable_reason", lambda: None)  # as on a GPU with Triton
    monkeypatch.delenv("MINISGL_DECODE_ATTENTION", raising=False)
    auto = DecodeAttentionLimits.from_env()
    assert auto == DecodeAttentionLimits(ROWS, TOKENS)
    # an engine whose requests never exceed the limit needs no FlashInfer graph for small sizes
    assert auto.graph_kinds(1, TOKENS) == ["triton"]
    assert auto.graph_kinds(ROWS, TOKENS + 1) == ["triton", "flashinfer"]
    assert auto.graph_kinds(ROWS + 1, TOKENS) == ["flashinfer"]
    assert auto.decode_kind(ROWS, [10, TOKENS]) == "triton"
    assert auto.decode_kind(ROWS, [10, TOKENS + 1]) == "flashinfer"  # one long request decides for the batch
    assert auto.decode_kind(ROWS + 1, [10]) == "flashinfer"

    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "flashinfer")
    assert DecodeAttentionLimits.from_env().graph_kinds(1, 100) == ["flashinfer"]
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "Triton")
    forced = DecodeAttentionLimits.from_env()
    assert forced.graph_kinds(256, 40_960) == ["triton"] and forced.decode_kind(256, [40_960]) == "triton"
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "fused")  # as auto, attending in one kernel from qkv
    assert DecodeAttentionLimits.from_env() == DecodeAttentionLimits(ROWS, TOKENS, fused=True) and not auto.fused
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "trition")
    with pytest.raises(ValueError, match="'trition': use one of auto, triton, flashinfer, fused"):
        DecodeAttentionLimits.from_env()
    monkeypatch.setattr(fb, "triton_unavailable_reason", lambda: "no Triton")
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "triton")
    assert DecodeAttentionLimits.from_env() == DecodeAttentionLimits(0, 0)  # nothing to attend with
