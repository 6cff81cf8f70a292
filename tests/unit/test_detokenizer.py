"""Incremental detokenization: the streamed pieces add up to the one-shot decode, characters
split over several byte-level tokens come out whole, stop strings are trimmed."""

from __future__ import annotations

import pytest

from minisgl_engine.messages import DetokenizeMsg
from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete
from minisgl_engine.workers.detokenizer_worker import Detokenizer

pytestmark = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)

TEXTS = [
    "什么是 KV Cache？它是一种缓存。",
    "Emoji 🚀🧪 and accents: déjà vu, naïve café.",
    "  spaces   and\nnewlines\t tabs",
]


@pytest.fixture(scope="module")
def tokenizer():
    from minisgl_engine.tokenizer import load_tokenizer

    return load_tokenizer(demo_model_dir())


def stream(tokenizer, ids, stop=None):
    detok = Detokenizer(tokenizer)
    pieces, drops = [], 0
    for i, tok in enumerate(ids):
        last = i == len(ids) - 1
        reply, drop = detok.handle(
            DetokenizeMsg(
                7,
                tok,
                finished=last,
                finish_reason="length" if last else None,
                stop=stop if i == 0 else None,
            )
        )
        drops += drop
        if reply is not None:
            pieces.append(reply.incremental_output)
            if reply.finished:
                return pieces, reply, drops, detok
    return pieces, None, drops, detok


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_add_up_and_never_split_a_character(tokenizer, text):
    ids = tokenizer.encode(text)
    pieces, reply, _, detok = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)
    assert reply.finished and reply.completion_tokens == len(ids)
    assert detok.states == {}


def test_multi_byte_characters_span_tokens(tokenizer):
    """The test above would be vacuous if every character were one token."""
    ids = tokenizer.encode("🚀")
    assert len(ids) > 1
    assert tokenizer.decode(ids[:1]).endswith("\ufffd")


def test_stop_string_is_trimmed_and_ends_the_request(tokenizer):
    ids = tokenizer.encode("The answer is Paris. The end of the story is near.")
    pieces, reply, drops, detok = stream(tokenizer, ids, stop=["The end"])
    assert "".join(pieces) == "The answer is Paris. "
    assert reply.finish_reason == "stop" and drops == 1
    # later tokens of that request (already in flight) are ignored
    r, d = detok.handle(DetokenizeMsg(7, ids[0]))
    assert r is None and not d


def test_text_that_only_looks_like_a_stop_string_is_released(tokenizer):
    ids = tokenizer.encode("The answer is Paris. The story ends.")
    pieces, reply, drops, _ = stream(tokenizer, ids, stop=["The end"])
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert reply.finish_reason == "length" and drops == 0
