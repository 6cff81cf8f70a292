"""Accuracy of the packed CPU path on a GGUF (docs/benchmarks.md, "CPU: the demo model's GGUF").

1. Teacher-forced over real text: the quantized engine's next-token distribution against the
   float32 engine on the same file's dequantized weights (``--quantization none``): top-1
   agreement and mean KL(reference || quantized) per position, one row at a time (decode's
   products) and in batched prefills.
2. Greedy continuations of chat prompts: how many tokens the packed engine, the float32 engine
   and llama.cpp (llama-cpp-python, if installed) produce before the first difference.

With ``--kv-dtype float16`` (or bfloat16) instead: the packed engine with that KV cache against
the same engine with a float32 KV cache, in the same two ways (the one-row pass runs the C decode
step's attention over the 16-bit cache).

    .venv/bin/python scripts/cpu_agreement.py [--model X.gguf] [--tokens 64] [--kv-dtype float16]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from minisgl_engine.llm import LLM
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.weights.gguf_tensors import GGUF_WEIGHTS

TEXT = (
    "The history of the bicycle begins in the early nineteenth century. In 1817 Karl Drais, a German "
    "inventor, built a two-wheeled machine that its rider pushed along with his feet; it was called "
    "the running machine, or the dandy horse in England. Pedals came some decades later, attached to "
    "the front wheel, and the high-wheeled bicycles of the 1870s made that wheel as large as a rider's "
    "legs allowed, since one turn of the pedals meant one turn of the wheel. They were fast but "
    "dangerous: a rider who hit a stone could be thrown over the handlebars. The safety bicycle of the "
    "1880s solved this with two wheels of the same size and a chain that drove the rear wheel, and the "
    "pneumatic tyre, patented by John Boyd Dunlop in 1888, made the ride comfortable. Within a few years "
    "millions of people owned one. The bicycle gave workers a cheap way to reach factories far from "
    "home, and it gave many women a new freedom of movement; it also led to better roads, which cars "
    "would later use. Today there are more than a billion bicycles in the world, and many cities build "
    "lanes for them to cut traffic and pollution."
)
PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain photosynthesis to a child.",
    "Give three tips for learning a new language.",
    "What is 12 times 7?",
    "Describe a cat in two sentences.",
]


def teacher_forced_logits(llm: LLM, ids: list[int], one_row: bool, start: int = 8) -> torch.Tensor:
    """The next-token logits after ids[:n] for every n >= start. ``one_row``: each position alone,
    its prefix from the prefix cache, so every product has one row, as in decode (8-bit
    activations); else all positions in batched prefills (many rows: the products widen the
    weights to float32). Batched first: it fills the prefix cache for the one-row pass."""
    captured: list[torch.Tensor] = []
    hook = llm.engine.model.register_forward_hook(
        lambda mod, inp, out: captured.append(out.detach().clone())
    )
    prompts = [ids[:n] for n in range(start, len(ids))]
    for batch in [[p] for p in prompts] if one_row else [prompts]:
        llm.generate(batch, SamplingParams(max_tokens=1, temperature=0))
    hook.remove()
    return torch.cat(captured)


def llamacpp_teacher_forced_logits(
    gguf: str, ids: list[int], start: int = 8
) -> torch.Tensor | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    model = Llama(model_path=gguf, n_threads=2, n_ctx=1024, logits_all=True, verbose=False)
    model.reset()
    model.eval(ids)
    return torch.from_numpy(model.scores[start - 1 : len(ids) - 1].copy()).float()


def agreement(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    """Top-1 agreement and KL(reference || ours) per position."""
    kl = F.kl_div(ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none").sum(
        -1
    )
    return {
        "positions": ours.shape[0],
        "top1_agreement": round((ours.argmax(-1) == ref.argmax(-1)).float().mean().item(), 4),
        "mean_kl": round(kl.mean().item(), 5),
        "max_kl": round(kl.max().item(), 4),
        "logit_rel_error": round(((ours - ref).norm() / ref.norm()).item(), 4),
    }


def greedy(llm: LLM, prompt_ids: list[int], tokens: int) -> list[int]:
    [res] = llm.generate(
        [prompt_ids], SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    )
    return res.token_ids


def llamacpp_greedy(gguf: str, prompt_ids: list[int], tokens: int) -> list[int] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    model = Llama(model_path=gguf, n_threads=2, n_ctx=1024, verbose=False)
    model.reset()
    model.eval(prompt_ids)
    out = []
    for _ in range(tokens):
        token = model.sample(top_k=1, temp=0)
        out.append(token)
        model.eval([token])
    return out


def same_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def kv_dtype_agreement(model: str | None, kv_dtype: str, tokens: int) -> None:
    """The packed engine with a ``kv_dtype`` KV cache against itself with a float32 one."""
    narrow = LLM(model, device="cpu", max_kv_tokens=4096, kv_dtype=kv_dtype)
    wide = LLM(model, device="cpu", max_kv_tokens=4096, kv_dtype="float32")
    ids = narrow.encode(TEXT)
    for one_row in (False, True):
        name = "teacher_forced_one_row" if one_row else "teacher_forced_batched"
        ours, ref = (
            teacher_forced_logits(narrow, ids, one_row),
            teacher_forced_logits(wide, ids, one_row),
        )
        print(json.dumps({name: agreement(ours, ref), "kv_dtype": kv_dtype}))
    for prompt in PROMPTS:
        ids = narrow.encode(prompt, chat=True)
        ours, ref = greedy(narrow, ids, tokens), greedy(wide, ids, tokens)
        print(
            json.dumps(
                {
                    "prompt": prompt,
                    f"{kv_dtype}_vs_float32_kv": same_prefix(ours, ref),
                    "tokens": tokens,
                    "reply": narrow.decode(ours)[:80],
                }
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--kv-dtype",
        default=None,
        choices=["float16", "bfloat16"],
        help="compare this KV cache with a float32 one instead",
    )
    args = parser.parse_args()
    if args.kv_dtype is not None:
        kv_dtype_agreement(args.model, args.kv_dtype, args.tokens)
        return
    packed = LLM(args.model, device="cpu", max_kv_tokens=4096, kv_dtype="float32")
    reference = LLM(
        args.model, device="cpu", max_kv_tokens=4096, quantization="none", kv_dtype="float32"
    )
    gguf = str(packed.engine.model_dir / GGUF_WEIGHTS)
    ids = packed.encode(TEXT)
    ref = teacher_forced_logits(reference, ids, one_row=False)
    print(
        json.dumps(
            {
                "teacher_forced_batched": agreement(
                    teacher_forced_logits(packed, ids, one_row=False), ref
                )
            }
        )
    )
    print(
        json.dumps(
            {
                "teacher_forced_one_row": agreement(
                    teacher_forced_logits(packed, ids, one_row=True), ref
                )
            }
        )
    )
    llama = llamacpp_teacher_forced_logits(gguf, ids)
    if llama is not None:
        print(json.dumps({"teacher_forced_llamacpp": agreement(llama, ref)}))
    for prompt in PROMPTS:
        ids = packed.encode(prompt, chat=True)
        ours, ref = greedy(packed, ids, args.tokens), greedy(reference, ids, args.tokens)
        row = {"prompt": prompt, "packed_vs_float32": same_prefix(ours, ref)}
        llama = llamacpp_greedy(gguf, ids, args.tokens)
        if llama is not None:
            row["packed_vs_llamacpp"] = same_prefix(ours, llama)
            row["float32_vs_llamacpp"] = same_prefix(ref, llama)
        row["packed_reply"] = packed.decode(ours)[:80]
        print(json.dumps(row))


if __name__ == "__main__":
    main()
