"""Helpers of the soak suite (scales, stream checks, idle checks)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from server_utils import (  # noqa: F401 (used by the soak tests)
    MAX_KV_TOKENS,
    MAX_PREFILL_TOKENS,
    ServerProcess,
    group_gone,
    ipc_socket_paths,
    runtime_dir_of,
    wait_until,
)

from minisgl_engine.weights.demo import DEMO_MODEL_NAME


@dataclass(frozen=True)
class Scale:
    name: str
    clients: int  # concurrent streaming clients in the load test
    requests_each: int  # requests per client
    max_tokens: int  # per load request
    aborts: int  # requests in the abort storm
    abort_concurrency: int
    kv_requests: int  # concurrent requests against the small-KV server
    fuzz_examples: int  # hypothesis examples per decoder and strategy
    same_seed: int  # requests with one seed at once
    faults: bool  # SIGKILL/SIGTERM under load (each needs its own server start)
    ui_tabs: int  # browser tabs on one chat app in the UI abort storm
    ui_ends: int  # replies ended there by Stop or by closing the tab
    app_kills: int  # SIGKILLs of the chat app mid-reply (each but the first restarts it)


SCALES = {
    "short": Scale(
        "short",
        clients=12,
        requests_each=2,
        max_tokens=10,
        aborts=60,
        abort_concurrency=12,
        kv_requests=8,
        fuzz_examples=100,
        same_seed=8,
        faults=False,
        ui_tabs=3,
        ui_ends=6,
        app_kills=1,
    ),
    "full": Scale(
        "full",
        clients=64,
        requests_each=4,
        max_tokens=24,
        aborts=300,
        abort_concurrency=32,
        kv_requests=32,
        fuzz_examples=2000,
        same_seed=16,
        faults=True,
        ui_tabs=4,
        ui_ends=60,
        app_kills=3,
    ),
}


def chat_body(content: str, **kw) -> dict:
    return {"model": DEMO_MODEL_NAME, "messages": [{"role": "user", "content": content}], **kw}


def idle(srv: ServerProcess) -> bool:
    m = srv.metrics()
    return (
        m["minisgl_running_requests"] == 0
        and m["minisgl_waiting_requests"] == 0
        and m["minisgl_kv_pages_used"] == 0
        and m["minisgl_frontend_pending_requests"] == 0
    )


def assert_idle(srv: ServerProcess, timeout: float = 30.0) -> dict[str, float]:
    assert wait_until(lambda: idle(srv), timeout, interval=0.2), srv.metrics()
    m = srv.metrics()
    assert (
        m["minisgl_kv_pages_used"] + m["minisgl_kv_pages_cached"] + m["minisgl_kv_pages_free"]
        == m["minisgl_kv_pages_total"]
    ), m
    return m


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    """One SSE stream, checked for shape; returns text, finish_reason, TTFT and completion tokens."""
    t0 = time.perf_counter()
    ttft = None
    chunks, raw = [], []
    async with client.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.status_code == 200, (r.status_code, await r.aread())
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            raw.append(line[6:])
            if line[6:] != "[DONE]":
                c = json.loads(line[6:])
                chunks.append(c)
                if ttft is None and c["choices"] and c["choices"][0]["delta"].get("content"):
                    ttft = time.perf_counter() - t0
    assert raw and raw[-1] == "[DONE]" and raw.count("[DONE]") == 1, raw[-3:]
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[0]["choices"][0]["delta"].get("role") == "assistant", with_choices[0]
    finishes = [
        c["choices"][0]["finish_reason"] for c in with_choices if c["choices"][0]["finish_reason"]
    ]
    assert len(finishes) == 1, finishes
    usage = [c["usage"] for c in chunks if c.get("usage")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
    return dict(
        text=text,
        finish_reason=finishes[0],
        ttft=ttft if ttft is not None else time.perf_counter() - t0,
        tokens=usage[-1]["completion_tokens"] if usage else 0,
        elapsed=time.perf_counter() - t0,
    )


async def complete(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    r = await client.post(f"{url}/v1/chat/completions", json={**body, "stream": False})
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def run(coro):
    return asyncio.run(coro)


def load_prompts(n: int, offset: int = 0) -> list[str]:
    """Distinct short prompts (the greedy replies differ, and the radix cache shares only the
    template's prefix)."""
    topics = [
        "rivers",
        "bread",
        "planets",
        "violins",
        "bridges",
        "owls",
        "glaciers",
        "chess",
        "tea",
        "volcanoes",
        "bees",
        "clocks",
        "deserts",
        "trains",
        "coral",
        "lighthouses",
    ]
    return [
        f"In one sentence, fact #{i + offset} about {topics[(i + offset) % len(topics)]}?"
        for i in range(n)
    ]


WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def long_prompt(rng: random.Random, words: int = 300) -> str:
    """~1.3 tokens a word: several chunks at the soak server's 64-token prefill budget; random words
    so the radix cache cannot skip the prefill."""
    return "Summarise: " + " ".join(rng.choice(WORDS) for _ in range(words))


def save_tiny_model_with_demo_vocab(folder: Path, max_context: int) -> None:
    """A tiny random Llama (tests/tiny_models.py's shape) with the demo model's vocabulary, so it
    runs with the demo tokenizer (``--tokenizer``): a server that starts in seconds and computes
    next to nothing."""
    import torch
    from tiny_models import TINY
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY, "vocab_size": 49152, "max_position_embeddings": max_context})
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
