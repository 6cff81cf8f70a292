"""The multi-process server, for real: `minisgl-chat serve` with the demo model, its tokenizer,
scheduler and detokenizer processes over ZeroMQ, driven over HTTP and by the openai client."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import httpx
import pytest
from server_utils import (
    CLI,
    ServerProcess,
    free_port,
    group_gone,
    runtime_dir_of,
    titles,
    wait_until,
)

from minisgl_engine.weights.demo import DEMO_MODEL_NAME, demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete

pytestmark = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)

SEED_PROMPT = "什么是 KV Cache？"
MODEL = DEMO_MODEL_NAME  # what /v1/models lists for the demo model (test_openai_client checks it)


@pytest.fixture(scope="session")
def server(demo_server):
    return (
        demo_server  # conftest.py: shared with the other files that drive the demo model's server
    )


def chat_body(content: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def stream_chat(url: str, body: dict) -> tuple[list[dict], list[str]]:
    """(parsed chunks, raw data lines) of one SSE stream."""
    chunks, raw = [], []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                raw.append(line[6:])
                if line[6:] != "[DONE]":
                    chunks.append(json.loads(line[6:]))
    return chunks, raw


def chunk_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_process_titles(server):
    names = titles(server.workers())
    assert sum("minisgl-tokenizer-" in n for n in names) == 2, names
    assert any("minisgl-detokenizer-0" in n for n in names), names
    assert any("minisgl-TP0-scheduler" in n for n in names), names
    ps = subprocess.run(["ps", "auxww"], capture_output=True, text=True).stdout
    assert "minisgl-TP0-scheduler" in ps


def test_seed_request_streams_then_done(server):
    """The curl of docs/architecture.md ("The reference request"): several SSE chunks, then [DONE]; the text equals the non-stream reply."""
    body = chat_body(SEED_PROMPT, max_tokens=128)
    chunks, raw = stream_chat(server.url, body)
    assert raw[-1] == "[DONE]"
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) > 3
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200
    reply = r.json()
    assert chunk_text(chunks) == reply["choices"][0]["message"]["content"]
    assert "\ufffd" not in chunk_text(chunks)  # CJK comes out whole
    assert reply["usage"]["completion_tokens"] > 0 and reply["usage"]["prompt_tokens"] > 0


def test_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    [model] = client.models.list().data
    assert model.id == "SmolLM2-135M-Instruct" == MODEL and model.max_model_len == 8192
    res = client.chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
    )
    assert "Paris" in res.choices[0].message.content
    assert res.choices[0].finish_reason == "stop" and res.model == model.id
    stream = client.chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == res.choices[0].message.content
    comp = client.completions.create(
        model=model.id, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert comp.choices[0].text and comp.usage.completion_tokens == 8


def test_openai_client_gets_not_found_for_a_model_not_served(server):
    """The seed request's "Qwen/Qwen3-0.6B" against the demo model: a 404 on both routes, streamed or not."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    for stream in (False, True):
        with pytest.raises(NotFoundError) as chat:
            client.chat.completions.create(
                model="Qwen/Qwen3-0.6B",
                messages=[{"role": "user", "content": SEED_PROMPT}],
                max_tokens=4,
                stream=stream,
            )
        with pytest.raises(NotFoundError) as completion:
            client.completions.create(
                model="Qwen/Qwen3-0.6B",
                prompt="The capital of France is",
                max_tokens=4,
                stream=stream,
            )
        for raised in (chat.value, completion.value):
            assert raised.status_code == 404 and raised.body == {
                "message": "The model `Qwen/Qwen3-0.6B` does not exist.",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }


def test_n_sampled_choices_share_one_prefill_and_each_reproduces_alone(server):
    """n=3 with a seed: three different choices, choice j the same as a request of its own with
    seed + j; the prompt is prefilled once (each choice finds it in the radix cache)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    messages = [
        {"role": "user", "content": "Write a short poem about the sea and the wind, in four lines."}
    ]
    assert wait_until(lambda: server.metrics()["minisgl_running_requests"] == 0, 5.0)
    before = server.metrics()["minisgl_prefix_cache_hit_tokens_total"]
    res = client.chat.completions.create(
        model=MODEL, messages=messages, n=3, temperature=1.0, seed=11, max_tokens=16
    )
    texts = [c.message.content for c in res.choices]
    assert [c.index for c in res.choices] == [0, 1, 2] and len(set(texts)) == 3, texts
    want = 3 * (
        res.usage.prompt_tokens - 1
    )  # each choice found the prompt (all but the token it recomputes)
    assert wait_until(
        lambda: server.metrics()["minisgl_prefix_cache_hit_tokens_total"] - before >= want, 5.0
    )
    assert 3 <= res.usage.completion_tokens <= 3 * 16
    alone = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=1.0, seed=12, max_tokens=16
    )
    assert alone.choices[0].message.content == texts[1]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, n=3, temperature=1.0, seed=11, max_tokens=16, stream=True
    )
    streamed = ["", "", ""]
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == texts


def test_a_batch_of_prompts_answers_as_one_by_one(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    prompts = ["The capital of France is", "Water boils at", "The largest planet is"]
    batch = client.completions.create(model=MODEL, prompt=prompts, max_tokens=10, temperature=0)
    singles = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0)
        for p in prompts
    ]
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    ids = client.completions.create(
        model=MODEL, prompt=[[504, 3575, 282], [11, 12, 13]], max_tokens=4, temperature=0, n=2
    )
    assert len(ids.choices) == 4 and ids.choices[0].text == ids.choices[1].text


def test_concurrent_streams_equal_single_results(server):
    prompts = [f"Write one sentence about the number {i}." for i in range(8)]
    singles = []
    for p in prompts:
        r = httpx.post(
            f"{server.url}/v1/chat/completions", json=chat_body(p, max_tokens=24), timeout=120
        )
        singles.append(r.json()["choices"][0]["message"]["content"])

    async def one(client: httpx.AsyncClient, p: str) -> str:
        text = ""
        async with client.stream(
            "POST",
            f"{server.url}/v1/chat/completions",
            json=chat_body(p, max_tokens=24, stream=True),
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    c = json.loads(line[6:])
                    if c["choices"]:
                        text += c["choices"][0]["delta"].get("content") or ""
        return text

    async def all_at_once() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    assert asyncio.run(all_at_once()) == singles


@pytest.mark.parametrize(
    "body",
    [
        chat_body("hello " * 9000, max_tokens=8),  # longer than the 8192-token context
        chat_body("hi", max_tokens=-1),
        chat_body("hi", temperature="hot"),
        chat_body("hi", n=0),
    ],
    ids=["too-long", "negative-max-tokens", "temperature-type", "n-0"],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_requests_get_openai_400(server, body, stream):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": stream}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    ok = httpx.post(
        f"{server.url}/v1/chat/completions", json=chat_body("Say hi.", max_tokens=4), timeout=60
    )
    assert ok.status_code == 200


def test_malformed_json_gets_400(server):
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400 and "error" in r.json()


def test_too_long_prompt_names_the_limit(server):
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=chat_body("hello " * 9000, max_tokens=8),
        timeout=60,
    )
    assert "8192" in r.json()["error"]["message"]


def test_disconnect_mid_stream_frees_everything(server):
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json=chat_body("Tell me a very long story.", max_tokens=2000, stream=True, ignore_eos=True),
        timeout=60,
    ) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert server.metrics()["minisgl_running_requests"] == 1
    # the connection is closed here, mid-reply
    assert wait_until(
        lambda: (
            server.metrics()["minisgl_running_requests"] == 0
            and server.metrics()["minisgl_kv_pages_used"] == 0
        ),
        2.0,
    )
    m = server.metrics()
    assert (
        m["minisgl_kv_pages_used"] + m["minisgl_kv_pages_cached"] + m["minisgl_kv_pages_free"]
        == m["minisgl_kv_pages_total"]
    )
    assert wait_until(lambda: server.metrics()["minisgl_frontend_pending_requests"] == 0, 2.0)


def test_disconnect_non_stream_aborts(server):
    before = server.metrics()["minisgl_requests_aborted_total"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/chat/completions",
            json=chat_body("Tell me a very long story.", max_tokens=2000, ignore_eos=True),
            timeout=1.5,
        )
    assert wait_until(lambda: server.metrics()["minisgl_requests_aborted_total"] == before + 1, 3.0)
    m = server.metrics()
    assert m["minisgl_running_requests"] == 0 and m["minisgl_kv_pages_used"] == 0


def test_a_stop_string_is_a_finish_not_an_abort(server):
    """The detokenizer finds the stop string and has the scheduler drop the request: /metrics
    counts it finished, as it counts EOS, and frees its pages."""
    before = server.metrics()
    body = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 200,
        "ignore_eos": True,
        "stop": ["."],
    }
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert (
        reply["choices"][0]["finish_reason"] == "stop" and "." not in reply["choices"][0]["text"]
    ), reply
    assert reply["usage"]["completion_tokens"] < 200
    assert wait_until(
        lambda: (
            server.metrics()["minisgl_requests_finished_total"]
            == before["minisgl_requests_finished_total"] + 1
        ),
        3.0,
    )
    after = server.metrics()
    assert after["minisgl_requests_aborted_total"] == before["minisgl_requests_aborted_total"]
    assert after["minisgl_running_requests"] == 0 and after["minisgl_kv_pages_used"] == 0


def test_metrics_are_prometheus(server):
    m = server.metrics()
    for name in (
        "minisgl_running_requests",
        "minisgl_waiting_requests",
        "minisgl_kv_pages_total",
        "minisgl_kv_pages_used",
        "minisgl_kv_pages_cached",
        "minisgl_kv_pages_free",
        "minisgl_prompt_tokens_total",
        "minisgl_generation_tokens_total",
        "minisgl_requests_finished_total",
        "minisgl_requests_aborted_total",
        "minisgl_prefix_cache_hit_tokens_total",
    ):
        assert name in m, name
    assert m["minisgl_kv_pages_total"] == 16384
    assert (
        "# TYPE minisgl_prefix_cache_hit_tokens_total counter"
        in httpx.get(f"{server.url}/metrics", timeout=5).text
    )


# ---- the radix prefix cache (the server's default) ------------------------------------------

TURN_1 = [{"role": "user", "content": "Give me three tips for writing clear code."}]
TURN_2_QUESTION = {"role": "user", "content": "Explain the second tip in more detail."}
REPLY_TOKENS = 24


def chat_turns(url: str) -> tuple[list[str], list[dict]]:
    """Two greedy turns of one chat: (replies, usages)."""
    replies, usages, messages = [], [], list(TURN_1)
    for follow_up in (TURN_2_QUESTION, None):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": REPLY_TOKENS},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        replies.append(r.json()["choices"][0]["message"]["content"])
        usages.append(r.json()["usage"])
        if follow_up is not None:
            messages = [*messages, {"role": "assistant", "content": replies[-1]}, follow_up]
    return replies, usages


def test_chat_turn_two_reuses_the_kv_of_turn_one(server):
    """Turn 2 resends turn 1's prompt and reply: the cache finds the prompt and (page size 1)
    at least half of the reply, minus one page; nothing stays locked afterwards."""

    def hits() -> float:
        return server.metrics()["minisgl_prefix_cache_hit_tokens_total"]

    messages = list(TURN_1)
    first = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": REPLY_TOKENS},
        timeout=120,
    ).json()
    reply, usage = first["choices"][0]["message"]["content"], first["usage"]
    assert usage["completion_tokens"] >= 8
    assert wait_until(lambda: server.metrics()["minisgl_running_requests"] == 0, 5.0)
    before = hits()
    body = {
        "model": MODEL,
        "messages": [*messages, {"role": "assistant", "content": reply}, TURN_2_QUESTION],
        "max_tokens": 1,
    }
    assert (
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).status_code == 200
    )
    want = usage["prompt_tokens"] + usage["completion_tokens"] // 2 - 1
    assert wait_until(lambda: hits() - before >= want, 5.0), (hits() - before, want, usage)
    assert wait_until(lambda: server.metrics()["minisgl_kv_pages_used"] == 0, 5.0)
    m = server.metrics()
    assert m["minisgl_kv_pages_cached"] > 0
    assert (
        m["minisgl_kv_pages_used"] + m["minisgl_kv_pages_cached"] + m["minisgl_kv_pages_free"]
        == m["minisgl_kv_pages_total"]
    )


@pytest.mark.slow
def test_greedy_chat_replies_equal_with_radix_and_naive(server):
    """The server (radix, turn 2 from cached KV) and an in-process engine with --cache naive
    give the same greedy replies, turn after turn."""
    from minisgl_engine.llm import LLM
    from minisgl_engine.sampling_params import SamplingParams

    replies, usages = chat_turns(server.url)
    naive = LLM(device="cpu", max_kv_tokens=2048, cache="naive")
    messages = list(TURN_1)
    for reply, usage, follow_up in zip(replies, usages, (TURN_2_QUESTION, None)):
        ids = naive.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert len(ids) == usage["prompt_tokens"]
        [res] = naive.generate([list(ids)], SamplingParams(max_tokens=REPLY_TOKENS))
        assert naive.decode(res.token_ids) == reply
        if follow_up is not None:
            messages = [*messages, {"role": "assistant", "content": reply}, follow_up]


# ---- start-up refusals: one line, exit code 2, nothing started ----------------------------


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_non_loopback_without_key_is_refused():
    proc = run_cli("serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--api-key" in proc.stderr


def test_port_in_use_is_refused(server):
    proc = run_cli("serve", "--port", str(server.port))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and str(server.port) in proc.stderr


# ---- a second instance: API key, model names, independence, shutdown ----------------------


def test_second_instance_with_api_key_and_served_model_names_then_sigterm(server, tmp_path):
    # --port 0: the system picks a free port, and the "ready at" line names it
    other = ServerProcess(
        "--api-key",
        "s3cret",
        "--served-model-name",
        "my-assistant,gpt-4o-mini",
        log_path=tmp_path / "other.log",
        port=0,
    )
    assert other.port != 0
    try:
        body = chat_body("What is the capital of France?", max_tokens=16, model="gpt-4o-mini")
        assert (
            httpx.post(f"{other.url}/v1/chat/completions", json=body, timeout=60).status_code == 401
        )
        bad = httpx.post(
            f"{other.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer nope"},
            timeout=60,
        )
        assert bad.status_code == 401 and "error" in bad.json()
        good = httpx.post(
            f"{other.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer s3cret"},
            timeout=60,
        )
        ours = httpx.post(
            f"{server.url}/v1/chat/completions", json={**body, "model": MODEL}, timeout=60
        )
        assert (
            good.json()["choices"][0]["message"]["content"]
            == ours.json()["choices"][0]["message"]["content"]
        )
        assert_served_as_first_name(other, "s3cret", ["my-assistant", "gpt-4o-mini"])
        workers = other.workers()
        assert len(workers) >= 3
        folder = runtime_dir_of(other)
        other.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert (
            other.proc.wait(5) == 0
        )  # an orderly stop is a success, not death by the signal (-15)
        assert wait_until(lambda: group_gone(workers), 5 - (time.monotonic() - t0) + 0.5)
        # nothing stays behind, not even the sockets folder (regression: uvicorn re-raised SIGTERM
        # under the default handler, killing main before it stopped the workers and removed it)
        assert not folder.exists(), sorted(p.name for p in folder.iterdir())
        # the first server is unaffected
        assert (
            httpx.post(
                f"{server.url}/v1/chat/completions", json={**body, "model": MODEL}, timeout=60
            ).status_code
            == 200
        )
    finally:
        other.stop()


def assert_served_as_first_name(srv: ServerProcess, api_key: str, names: list[str]) -> None:
    """--served-model-name: /v1/models lists the first name, every name is answered (as the
    first), the model's own name no longer is; the "ready at" line says the names."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{srv.url}/v1", api_key=api_key)
    assert [m.id for m in client.models.list().data] == names[:1]
    for name in names:
        done = client.completions.create(
            model=name, prompt="The capital of France is", max_tokens=2
        )
        stream = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, stream=True
        )
        assert done.model == names[0] and {chunk.model for chunk in stream} == {names[0]}
    with pytest.raises(NotFoundError) as own_name:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert own_name.value.code == "model_not_found"
    assert f"(model {MODEL} as {', '.join(names)} on " in srv.output()


def test_sigkill_of_main_takes_workers_down(tmp_path):
    srv = ServerProcess(log_path=tmp_path / "killed.log")
    workers = srv.workers()
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(5)
    assert wait_until(lambda: group_gone(workers), 5.0), titles(workers)


def test_worker_that_fails_to_start_ends_serve_with_its_error(tiny_model, tmp_path):
    """Weights that load in no worker: serve exits non-zero, naming the worker and the reason."""
    import shutil

    folder, _ = tiny_model("llama")
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    proc = subprocess.run(
        [*CLI, "serve", "--device", "cpu", "--port", str(free_port()), "--model", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "minisgl-TP0-scheduler failed to start" in proc.stderr, proc.stderr


def test_tp_other_than_one_is_refused_in_one_line():
    proc = run_cli("generate", "--tp", "2", "--dummy-weights", "--config", "qwen3-0.6b", "hi")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--tp" in proc.stderr


def test_runtime_dirs_are_private_and_unique():
    from minisgl_engine.workers.ipc import make_runtime_dir, remove_runtime_dir

    a, b = make_runtime_dir(), make_runtime_dir()
    try:
        assert a != b
        assert a.stat().st_mode & 0o777 == 0o700
    finally:
        remove_runtime_dir(a)
        remove_runtime_dir(b)
