"""Logprobs, penalties, logit bias, min_p, min_tokens and grammars on the GPU path (CUDA graphs,
overlap scheduling, FlashInfer sampling): the model's logprobs as transformers computes them in
float32, within bf16's reach; requests that ask for nothing keep their tokens beside requests
that ask for everything; grammar-constrained replies parse while overlap scheduling runs step
N+1 before step N's tokens are read. Skipped without a GPU; run with ``pytest -m cuda``.

The model: Qwen3-0.6B's shapes with random weights and the demo model's tokenizer (the vocabulary
cut to the tokenizer's), from the demo model's folder or ``.tok/tokenizer`` (the device machine)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.cuda

from minisgl_engine.config import EngineConfig  # noqa: E402
from minisgl_engine.llm import LLM  # noqa: E402
from minisgl_engine.sampling_params import GrammarSpec, SamplingParams  # noqa: E402

CARRIED_TOKENIZER = Path(__file__).resolve().parents[2] / ".tok" / "tokenizer"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def tokenizer_folder() -> Path | None:
    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if is_complete(demo_model_dir()):
        return demo_model_dir()
    return CARRIED_TOKENIZER if (CARRIED_TOKENIZER / "tokenizer.json").exists() else None


@pytest.fixture(scope="module")
def model_pair(tmp_path_factory):
    """(LLM on CUDA in bf16, transformers in float32 and in bf16 on the same weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minisgl_engine.model_loader import load_hf_config

    source = tokenizer_folder()
    if source is None:
        pytest.skip("needs the demo tokenizer: `minisgl-chat pull`, or .tok/tokenizer")
    folder = tmp_path_factory.mktemp("qwen3-shape-demo-vocab")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    config = load_hf_config(EngineConfig(config="qwen3-0.6b"), None)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config.vocab_size, config.eos_token_id, config.bos_token_id = (
        len(tokenizer),
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(
                p.to(torch.bfloat16).float()
            )  # weights exact in bf16: both sides see the same ones
    hf.to(torch.bfloat16).save_pretrained(folder)
    llm = LLM(
        config=EngineConfig(
            model=str(folder),
            device="cuda",
            dtype="bfloat16",
            max_kv_tokens=40_000,
            max_running_requests=64,
            cuda_graph_max_bs=64,
            attn="flashinfer",
        )
    )
    assert llm.engine.uses_cuda_graphs and llm.scheduler.overlap
    hf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    return llm, hf.float().cuda().eval(), hf16


def prompts(llm: LLM) -> list[list[int]]:
    texts = [
        "Describe a person as JSON.",
        "The capital of France is",
        "List three colours:",
        "Once upon a time",
    ]
    return [llm.encode(t) for t in texts]


def test_logprobs_are_the_models_own_within_bf16(model_pair):
    """Judged as test_cuda.py judges logits: against transformers in float32, relative to how far
    transformers' own bf16 run lands from it on the same tokens."""
    llm, hf32, hf16 = model_pair
    results = llm.generate(
        prompts(llm), SamplingParams(max_tokens=16, logprobs=True, top_logprobs=5, ignore_eos=True)
    )
    ours, theirs = [], []
    for prompt, result in zip(prompts(llm), results):
        assert len(result.logprobs) == 16
        ids = torch.tensor([prompt + result.token_ids], device="cuda")
        with torch.no_grad():
            ref = hf32(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
            bf16 = hf16(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        for step, (token, lp) in enumerate(zip(result.token_ids, result.logprobs)):
            # greedy: the sampled token is the likeliest (bf16 logits tie often: another id may share the top value)
            assert lp.logprob == lp.top[0][1]
            assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
            ours.append(abs(lp.logprob - ref[step, token].item()))
            theirs.append(abs(bf16[step, token].item() - ref[step, token].item()))
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    print(
        f"logprob error vs transformers fp32: ours (bf16) median {median(ours):.4f} max {max(ours):.4f}; "
        f"transformers bf16 median {median(theirs):.4f} max {max(theirs):.4f}"
    )
    assert median(ours) <= max(2 * median(theirs), 0.01)
    assert max(ours) <= max(2 * max(theirs), 0.05)


def test_prompt_logprobs_are_the_models_own_within_bf16(model_pair):
    """echo's prompt scoring: every prompt position's logits (a prompt of ~1,300 tokens, so the
    1,024-token chunks of a scored prompt are crossed), judged as the sampled tokens' are."""
    llm, hf32, hf16 = model_pair
    long_prompt = (prompts(llm)[1] + prompts(llm)[3]) * 130
    ps = prompts(llm)[:2] + [long_prompt]
    results = llm.generate(ps, SamplingParams(max_tokens=2, prompt_logprobs=3))
    ours, theirs = [], []
    for prompt, result in zip(ps, results):
        assert len(result.prompt_logprobs) == len(prompt) and result.prompt_logprobs[0] is None
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            ref = hf32(ids).logits[0, :-1].float().log_softmax(-1)
            bf16 = hf16(ids).logits[0, :-1].float().log_softmax(-1)
        targets = torch.tensor(prompt[1:], device="cuda").view(-1, 1)
        ref_chosen, bf16_chosen = (
            ref.gather(1, targets).squeeze(1).tolist(),
            bf16.gather(1, targets).squeeze(1).tolist(),
        )
        for position, entry in enumerate(result.prompt_logprobs[1:]):
            assert len(entry.top) == 3 and entry.top[0][1] >= entry.logprob - 1e-6
            ours.append(abs(entry.logprob - ref_chosen[position]))
            theirs.append(abs(bf16_chosen[position] - ref_chosen[position]))
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    print(
        f"prompt logprob error vs transformers fp32 over {len(ours)} tokens: ours (bf16) median {median(ours):.4f} max {max(ours):.4f}; "
        f"transformers bf16 median {median(theirs):.4f} max {max(theirs):.4f}"
    )
    assert median(ours) <= max(2 * median(theirs), 0.01)
    assert max(ours) <= max(2 * max(theirs), 0.05)


def test_plain_requests_keep_their_tokens_beside_every_option(model_pair):
    """The same batch shapes with and without the options (every request runs its full length),
    so the plain rows see the same kernels: their tokens must not change."""
    llm = model_pair[0]
    ps = prompts(llm)
    plain = [
        SamplingParams(max_tokens=32, ignore_eos=True),
        SamplingParams(max_tokens=32, temperature=0.8, seed=5, ignore_eos=True),
    ]
    extras = [
        SamplingParams(max_tokens=32, ignore_eos=True, logprobs=True, top_logprobs=20),
        SamplingParams(
            max_tokens=32,
            ignore_eos=True,
            frequency_penalty=1.0,
            presence_penalty=0.5,
            repetition_penalty=1.3,
        ),
        SamplingParams(
            max_tokens=32, ignore_eos=True, logit_bias={100: 5.0, 200: -100.0}, min_tokens=8
        ),
        SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.9, min_p=0.2, seed=9),
        SamplingParams(
            max_tokens=32, ignore_eos=True, grammar=GrammarSpec("json_schema", json.dumps(SCHEMA))
        ),
        SamplingParams(max_tokens=32, ignore_eos=True, prompt_logprobs=5),
    ]
    filler = [replace(plain[0]) for _ in extras]
    alone = llm.generate(ps[:2] + ps * 2, plain + filler + [replace(plain[0]) for _ in range(2)])
    mixed = llm.generate(ps[:2] + ps * 2, plain + extras + [replace(plain[0]) for _ in range(2)])
    assert [r.token_ids for r in mixed[:2]] == [r.token_ids for r in alone[:2]]
    assert mixed[2].logprobs and not mixed[0].logprobs


def test_grammars_hold_under_overlap_scheduling_and_cuda_graphs(model_pair):
    llm = model_pair[0]
    ps = prompts(llm)
    n = 24  # decode batches replay CUDA graphs; a JSON request beside plain ones, greedy and sampled
    params = []
    for i in range(n):
        sampled = dict(temperature=1.0, seed=i) if i % 2 else {}
        kind = i % 3
        if kind == 0:
            params.append(
                SamplingParams(
                    max_tokens=200,
                    grammar=GrammarSpec("json_schema", json.dumps(SCHEMA)),
                    **sampled,
                )
            )
        elif kind == 1:
            params.append(
                SamplingParams(
                    max_tokens=40,
                    grammar=GrammarSpec("regex", r"(yes|no), [a-z]{1,8}( [a-z]{1,8}){0,4}\."),
                    **sampled,
                )
            )
        else:
            params.append(SamplingParams(max_tokens=40, ignore_eos=True, **sampled))
    results = llm.generate([ps[i % len(ps)] for i in range(n)], params)
    for p, r in zip(params, results):
        if p.grammar is None:
            assert len(r.token_ids) == 40
        elif p.grammar.kind == "json_schema":
            assert r.finish_reason == "stop", r.text
            value = json.loads(r.text)
            assert (
                set(value) == {"name", "age", "tags"}
                and 0 <= value["age"] <= 120
                and len(value["name"]) <= 12
            ), value
            assert set(value["tags"]) <= {"a", "b", "c"} and len(value["tags"]) <= 3
        else:
            assert r.finish_reason == "stop" and re.fullmatch(
                r"(yes|no), [a-z]{1,8}( [a-z]{1,8}){0,4}\.", r.text
            ), r.text
