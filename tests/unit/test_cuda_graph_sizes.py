"""The CUDA graph batch sizes (pure Python: runs without a GPU)."""

from minisgl_engine.kernels.cuda_graph import capture_sizes


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
    assert (
        auto.decode_kind(ROWS, [10, TOKENS + 1]) == "flashinfer"
    )  # one long request decides for the batch
    assert auto.decode_kind(ROWS + 1, [10]) == "flashinfer"

    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "flashinfer")
    assert DecodeAttentionLimits.from_env().graph_kinds(1, 100) == ["flashinfer"]
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "Triton")
    forced = DecodeAttentionLimits.from_env()
    assert (
        forced.graph_kinds(256, 40_960) == ["triton"]
        and forced.decode_kind(256, [40_960]) == "triton"
    )
    monkeypatch.setenv(
        "MINISGL_DECODE_ATTENTION", "fused"
    )  # as auto, attending in one kernel from qkv
    assert (
        DecodeAttentionLimits.from_env() == DecodeAttentionLimits(ROWS, TOKENS, fused=True)
        and not auto.fused
    )
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "trition")
    with pytest.raises(ValueError, match="'trition': use one of auto, triton, flashinfer, fused"):
        DecodeAttentionLimits.from_env()
    monkeypatch.setattr(fb, "triton_unavailable_reason", lambda: "no Triton")
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", "triton")
    assert DecodeAttentionLimits.from_env() == DecodeAttentionLimits(0, 0)  # nothing to attend with


def test_large_decode_graphs_read_short_requests_kv_whole_and_long_ones_split(monkeypatch):
    """From DECODE_WHOLE_KV_FROM rows a second FlashInfer graph reads K/V unsplit, replayed
    while no request is longer than DECODE_WHOLE_KV_MAX_CONTEXT; both limits come from the
    environment when set there."""
    import pytest

    from minisgl_engine.attention import flashinfer_backend as fb
    from minisgl_engine.attention.flashinfer_backend import DECODE_WHOLE_KV_FROM as ROWS
    from minisgl_engine.attention.flashinfer_backend import DECODE_WHOLE_KV_MAX_CONTEXT as TOKENS
    from minisgl_engine.attention.flashinfer_backend import DecodeAttentionLimits

    monkeypatch.setattr(fb, "triton_unavailable_reason", lambda: None)
    for name in (
        "MINISGL_DECODE_ATTENTION",
        "MINISGL_DECODE_WHOLE_KV_FROM",
        "MINISGL_DECODE_WHOLE_KV_MAX_CONTEXT",
    ):
        monkeypatch.delenv(name, raising=False)
    auto = DecodeAttentionLimits.from_env()
    assert (auto.whole_kv_rows, auto.whole_kv_max_context) == (ROWS, TOKENS)
    assert auto.graph_kinds(ROWS, 40_960) == ["whole", "flashinfer"]
    assert auto.graph_kinds(ROWS, TOKENS) == ["whole"]  # no request can outgrow it: no split graph
    assert auto.graph_kinds(ROWS - 1, 40_960) == ["flashinfer"]
    assert auto.decode_kind(ROWS, [10, TOKENS]) == "whole"
    assert (
        auto.decode_kind(ROWS, [10, TOKENS + 1]) == "flashinfer"
    )  # one long request: split, as before
    assert auto.decode_kind(ROWS - 1, [10]) == "flashinfer"
    # every kind a step may pick was captured
    for limits in (auto, DecodeAttentionLimits(8, 1000, whole_kv_rows=4, whole_kv_max_context=500)):
        for rows in (1, 4, 8, 9, 64, 256):
            for longest in (1, 499, 500, 501, 999, 1000, 1001, 2048, 2049, 5000):
                assert limits.decode_kind(rows, [longest]) in limits.graph_kinds(rows, 5000), (
                    limits,
                    rows,
                    longest,
                )

    monkeypatch.setenv("MINISGL_DECODE_WHOLE_KV_FROM", "128")
    monkeypatch.setenv("MINISGL_DECODE_WHOLE_KV_MAX_CONTEXT", "8192")
    told = DecodeAttentionLimits.from_env()
    assert told.decode_kind(64, [10]) == "flashinfer" and told.decode_kind(128, [8192]) == "whole"
    monkeypatch.setenv("MINISGL_DECODE_WHOLE_KV_FROM", "64 rows")
    with pytest.raises(
        ValueError, match="MINISGL_DECODE_WHOLE_KV_FROM='64 rows': use 1 positive integers, rows"
    ):
        DecodeAttentionLimits.from_env()
