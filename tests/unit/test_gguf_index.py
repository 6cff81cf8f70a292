"""The quick GGUF header reader finds what the ``gguf`` package's reader finds: the same
tensors (name, type, shape, bytes, place) with the same values, and the same scalar metadata."""

from __future__ import annotations

import numpy as np
import pytest

from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete
from minisgl_engine.weights.layout import GGUF_WEIGHTS

pytestmark = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)


def test_the_demo_files_tensors_and_metadata_match_the_gguf_package():
    from gguf import GGUFReader

    from minisgl_engine.weights.gguf_index import GGUFIndex

    path = demo_model_dir() / GGUF_WEIGHTS
    reference, ours = GGUFReader(str(path)), GGUFIndex(path)
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for theirs, mine in zip(reference.tensors, ours.tensors):
        assert mine.qtype == int(theirs.tensor_type)
        assert mine.dims == tuple(theirs.shape.tolist())
        assert (mine.n_elements, mine.n_bytes) == (int(theirs.n_elements), int(theirs.n_bytes))
        assert mine.offset == theirs.data_offset
    for i in (0, 1, len(ours.tensors) // 2, len(ours.tensors) - 1):
        expected = np.array(reference.tensors[i].data).reshape(-1)
        assert np.array_equal(ours.data(ours.tensors[i]), expected)
    for key in ("general.architecture", "llama.attention.head_count", "llama.block_count"):
        field = reference.fields[key]
        value = field.contents()
        assert ours.metadata[key] == value


def test_a_truncated_file_is_refused(tmp_path):
    from minisgl_engine.weights.gguf_index import GGUFIndex

    path = tmp_path / "cut.gguf"
    with open(demo_model_dir() / GGUF_WEIGHTS, "rb") as f:
        path.write_bytes(f.read(4096))
    with pytest.raises(ValueError, match="truncated"):
        GGUFIndex(path)
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="magic"):
        GGUFIndex(path)
