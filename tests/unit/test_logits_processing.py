"""Per-request logits edits and logprobs in the engine (CPU, float32 weights and KV cache: the
float16 cache's own agreement is test_model_parity's), against Hugging Face
transformers on the same tiny random checkpoint: repetition / frequency / presence penalties,
logit_bias and min_tokens give transformers' greedy tokens under the same rule; logprobs are the
model's own log-softmax; min_p; and requests that ask for nothing come out the same in a batch
that mixes them with requests that do."""

from __future__ import annotations

import pytest
import torch

from minisgl_engine.llm import LLM, SamplingParams

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [12, 12, 12, 64, 3], [200, 150, 100, 50, 25, 12, 6, 3]]
NEW = 24
EOS = 1  # tiny_models.TINY


@pytest.fixture(scope="module")
def qwen3(tiny_model):
    folder, hf = tiny_model("qwen3")
    llm = LLM(
        str(folder),
        device="cpu",
        dtype="float32",
        kv_dtype="float32",
        max_kv_tokens=4096,
        max_running_requests=16,
    )
    return llm, hf


class Rule:
    """A transformers LogitsProcessor doing what a request's parameters say (the reference)."""

    def __init__(
        self, prompt_len: int, frequency=0.0, presence=0.0, bias=None, min_tokens=0
    ) -> None:
        self.prompt_len, self.frequency, self.presence, self.bias, self.min_tokens = (
            prompt_len,
            frequency,
            presence,
            bias or {},
            min_tokens,
        )

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for token, value in self.bias.items():
            scores[:, token] += value
        generated = input_ids[:, self.prompt_len :]
        if generated.shape[1] < self.min_tokens:
            scores[:, EOS] = float("-inf")
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype)
        )
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def hf_greedy(
    hf, prompt: list[int], new: int = NEW, repetition_penalty: float = 1.0, rule: Rule | None = None
) -> list[int]:
    from transformers import LogitsProcessorList

    out = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=new,
        do_sample=False,
        repetition_penalty=repetition_penalty,
        logits_processor=LogitsProcessorList([rule] if rule else []),
        eos_token_id=EOS,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize(
    "extra, rule, repetition",
    [
        (dict(repetition_penalty=1.8), None, 1.8),
        (dict(frequency_penalty=1.5), dict(frequency=1.5), 1.0),
        (dict(presence_penalty=2.0), dict(presence=2.0), 1.0),
        (
            dict(frequency_penalty=0.7, presence_penalty=-0.5),
            dict(frequency=0.7, presence=-0.5),
            1.0,
        ),
        (dict(logit_bias={7: 4.0, 33: -100.0}), dict(bias={7: 4.0, 33: -100.0}), 1.0),
        (dict(logit_bias={EOS: 30.0}, min_tokens=6), dict(bias={EOS: 30.0}, min_tokens=6), 1.0),
    ],
    ids=["repetition", "frequency", "presence", "frequency+presence", "logit_bias", "min_tokens"],
)
def test_greedy_tokens_match_transformers_under_the_same_rule(qwen3, extra, rule, repetition):
    """transformers' own repetition penalty; the others as a LogitsProcessor (Rule)."""
    llm, hf = qwen3
    results = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW, **extra))
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW))
    for prompt, result in zip(PROMPTS, results):
        reference = Rule(len(prompt), **rule) if rule else None
        assert result.token_ids == hf_greedy(
            hf, prompt, repetition_penalty=repetition, rule=reference
        )
    assert [r.token_ids for r in results] != [r.token_ids for r in plain], (
        "the parameter changed no reply: the test would pass without it"
    )
    if "min_tokens" in extra:  # EOS is banned for 6 tokens, then all but forced
        assert all(len(r.token_ids) == 7 and r.token_ids[-1] == EOS for r in results)


def test_logprobs_are_the_models_log_softmax(qwen3):
    llm, hf = qwen3
    params = [
        SamplingParams(max_tokens=8, logprobs=True, top_logprobs=5),
        SamplingParams(max_tokens=8, logprobs=True, temperature=1.0, seed=3, frequency_penalty=1.0),
    ]
    for prompt, one in zip(PROMPTS, params):
        result = llm.generate([prompt], one)[0]
        assert len(result.logprobs) == len(result.token_ids)
        with torch.no_grad():
            logits = (
                hf(torch.tensor([prompt + result.token_ids]))
                .logits[0, len(prompt) - 1 : -1]
                .float()
            )
        expected = logits.log_softmax(-1)
        for step, (token, lp) in enumerate(zip(result.token_ids, result.logprobs)):
            assert lp.logprob == pytest.approx(expected[step, token].item(), abs=1e-4)
            assert len(lp.top) == one.top_logprobs
            top = expected[step].topk(one.top_logprobs) if one.top_logprobs else None
            if top is not None:
                assert [t for t, _ in lp.top] == top.indices.tolist()
                assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)
                assert lp.top[0][0] == token, "greedy: the sampled token is the likeliest"


def test_prompt_logprobs_are_the_models_own_in_chunks_beside_plain_requests(qwen3):
    """Each prompt token's logprob given the tokens before it (echo), against transformers' log-
    softmax: computed in chunks of 3 tokens, with the prompts already in the prefix cache (which
    a scored prompt must not use), in one batch with a plain request, whose tokens stay its own."""
    llm, hf = qwen3
    plain = llm.generate(
        PROMPTS, SamplingParams(max_tokens=8)
    )  # the prompts are cached from here on
    prefill = llm.scheduler.prefill_manager
    budget, prefill.max_prefill_tokens = prefill.max_prefill_tokens, 3
    try:
        params = [
            SamplingParams(max_tokens=8, prompt_logprobs=0),
            SamplingParams(max_tokens=8, prompt_logprobs=5, logprobs=True),
            SamplingParams(max_tokens=8),
        ]
        mixed = llm.generate(PROMPTS, params)
    finally:
        prefill.max_prefill_tokens = budget
    assert [r.token_ids for r in mixed] == [r.token_ids for r in plain]
    assert mixed[2].prompt_logprobs == [] and not mixed[0].logprobs
    for prompt, result, p in zip(PROMPTS, mixed[:2], params):
        with torch.no_grad():
            expected = hf(torch.tensor([prompt])).logits[0, :-1].float().log_softmax(-1)
        assert len(result.prompt_logprobs) == len(prompt) and result.prompt_logprobs[0] is None
        for position, (token, entry) in enumerate(zip(prompt[1:], result.prompt_logprobs[1:])):
            assert entry.logprob == pytest.approx(expected[position, token].item(), abs=1e-4)
            top = expected[position].topk(p.prompt_logprobs)
            assert [t for t, _ in entry.top] == top.indices.tolist()
            assert [v for _, v in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)
    assert llm.scheduler.prefill_manager.prefix_hit_tokens > 0, (
        "the plain request did use the cache"
    )


def test_min_p_one_keeps_only_the_likeliest_token(qwen3):
    llm, _ = qwen3
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW))
    sampled = llm.generate(
        PROMPTS,
        [
            SamplingParams(max_tokens=NEW, temperature=1.5, min_p=1.0, seed=i)
            for i in range(len(PROMPTS))
        ],
    )
    assert [r.token_ids for r in sampled] == [r.token_ids for r in greedy]
    wide = llm.generate(
        PROMPTS,
        [
            SamplingParams(max_tokens=NEW, temperature=1.5, min_p=0.0, seed=i)
            for i in range(len(PROMPTS))
        ],
    )
    assert [r.token_ids for r in wide] != [r.token_ids for r in greedy], (
        "without min_p these seeds sample other tokens"
    )


EXTRAS = {
    "logprobs": dict(logprobs=True, top_logprobs=20),
    "penalties": dict(frequency_penalty=1.0, presence_penalty=0.5, repetition_penalty=1.3),
    "logit_bias": dict(logit_bias={9: 10.0}),
    "min_tokens": dict(min_tokens=10),
    "min_p": dict(temperature=0.9, min_p=0.2, seed=5),
}


@pytest.mark.parametrize("name", list(EXTRAS))
def test_plain_requests_are_unchanged_in_a_batch_mixed_with_extras(qwen3, name):
    llm, _ = qwen3
    plain = [
        SamplingParams(max_tokens=NEW),
        SamplingParams(max_tokens=NEW, temperature=0.8, seed=11),
    ]
    alone = llm.generate(PROMPTS[:2], plain)
    mixed = llm.generate(
        PROMPTS[:2] + PROMPTS,
        plain + [SamplingParams(max_tokens=NEW, **EXTRAS[name])] * len(PROMPTS),
    )
    assert [r.token_ids for r in mixed[:2]] == [r.token_ids for r in alone]


def test_penalties_follow_a_request_through_preemption(tiny_model):
    """A request sent back to the queue (KV cache full) and resumed on another page-table row
    keeps its counts: its tokens are those of an uninterrupted run."""
    folder, hf = tiny_model("qwen3")
    small = LLM(
        str(folder), device="cpu", dtype="float32", max_kv_tokens=64, max_running_requests=4
    )
    params = SamplingParams(max_tokens=20, frequency_penalty=1.2, presence_penalty=0.3)
    together = small.generate(PROMPTS, params)
    for prompt, result in zip(PROMPTS, together):
        assert result.token_ids == hf_greedy(
            hf, prompt, new=20, rule=Rule(len(prompt), frequency=1.2, presence=0.3)
        )


def test_each_request_gets_the_alternatives_it_asked_for(qwen3):
    llm, _ = qwen3
    counts = [0, 1, 5, 20]
    results = llm.generate(
        [PROMPTS[0]] * len(counts),
        [SamplingParams(max_tokens=4, logprobs=True, top_logprobs=k) for k in counts],
    )
    for k, result in zip(counts, results):
        assert [len(lp.top) for lp in result.logprobs] == [k] * 4


def test_token_bytes_for_byte_level_and_sentencepiece_tokenizers():
    from minisgl_engine.detokenize import TokenBytes

    class Metaspace:  # what a Llama-2 / Mistral tokenizer gives for its pieces
        pieces = {5: "\u2581Hello", 6: "<0xE2>", 7: "world"}

        def convert_ids_to_tokens(self, token_id):
            return self.pieces[token_id]

        def decode(self, ids):
            return "".join(self.pieces[i] for i in ids).replace("\u2581", "")

    table = TokenBytes(Metaspace())
    assert table.get(5) == (" Hello", list(b" Hello"))
    assert table.get(6) == ("\ufffd", [0xE2])
    assert table.get(7) == ("world", list(b"world"))
