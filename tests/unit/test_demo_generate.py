"""The built-in demo model (SmolLM2-135M-Instruct, converted from its GGUF) answers correctly."""

from __future__ import annotations

import pytest

from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
    ),
]


@pytest.fixture(scope="module")
def demo_llm():
    from minisgl_engine.llm import LLM

    return LLM(device="cpu", max_kv_tokens=4096)


def test_capital_of_france_is_paris(demo_llm):
    [res] = demo_llm.generate(
        "What is the capital of France?", SamplingParams(max_tokens=32), chat=True
    )
    assert "Paris" in res.text
    assert res.finish_reason == "stop"  # the model ends its turn with <|im_end|>
    assert demo_llm.scheduler.stats().kv_pages_used == 0


def test_same_seed_same_text(demo_llm):
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=1234)
    a, b = demo_llm.generate(["Tell me a story about a cat."] * 2, [params, params], chat=True)
    assert a.text == b.text and a.token_ids
    [c] = demo_llm.generate(
        "Tell me a story about a cat.",
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=99),
        chat=True,
    )
    assert c.token_ids != a.token_ids
