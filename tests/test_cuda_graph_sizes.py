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
