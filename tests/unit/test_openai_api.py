"""The OpenAI-compatible routes against a scripted front-end client (no workers, no model)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Callable

import anyio
import httpx
import openai
import pytest

from minisgl_engine.api.openai_api import create_app
from minisgl_engine.api.openai_protocol import DEFAULT_MAX_TOKENS
from minisgl_engine.messages import LogprobEntry, StatsMsg, UserReply
from minisgl_engine.workers.frontend import GenerateRequest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _prompt_words(req: GenerateRequest) -> list[str]:
    if req.messages is not None:
        return req.messages[-1]["content"].split()
    if req.input_ids is not None:
        return [str(i) for i in req.input_ids]
    return (req.text or "").split()


def echo_script(req: GenerateRequest) -> list[UserReply]:
    """Echoes the prompt word by word, up to max_tokens words; the last reply finishes."""
    words = _prompt_words(req)
    out = words[: req.params.max_tokens]
    reason = "length" if len(words) > req.params.max_tokens else "stop"
    replies = [UserReply(uid=1, incremental_output=f"{w} ") for w in out[:-1]]
    replies.append(
        UserReply(
            uid=1,
            incremental_output=f"{out[-1]} " if out else "",
            finished=True,
            finish_reason=reason,
            prompt_tokens=len(words),
            completion_tokens=len(out),
        )
    )
    return replies


def refuse_script(req: GenerateRequest) -> list[UserReply]:
    return [
        UserReply(
            uid=1,
            incremental_output="",
            finished=True,
            finish_reason="error",
            error="prompt has 9000 tokens, the context holds 8192",
        )
    ]


class FakeClient:
    """Plays a script of replies; records each request and how its generator ended."""

    model_name = "fake-model"
    thinks: str | None = None
    tool_format: str | None = None
    max_context_len: int | None = 8192
    tokenizer_path: str | None = None

    def __init__(
        self,
        script: Callable[[GenerateRequest], list[UserReply]] = echo_script,
        delay: float = 0.0,
        ready: bool = True,
    ) -> None:
        self.script = script
        self.delay = delay
        self.ready = ready
        self.stats: StatsMsg | None = None
        self.pending_count = 0
        self.requests: list[GenerateRequest] = []
        self.endings: list[str] = []  # "finished", or "aborted" when closed before the last reply

    def route(self, req: GenerateRequest) -> int:
        return 0

    async def generate(self, req: GenerateRequest) -> AsyncGenerator[UserReply, None]:
        self.requests.append(req)
        self.pending_count += 1
        delivered_last = False
        try:
            for reply in self.script(req):
                await asyncio.sleep(self.delay)
                delivered_last = reply.finished
                yield reply
        finally:
            self.pending_count -= 1
            self.endings.append("finished" if delivered_last else "aborted")


def http(app, **kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, **kwargs), base_url="http://localhost"
    )


def sse_payloads(text: str) -> list[str]:
    assert text.endswith("data: [DONE]\n\n")
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def assert_openai_error(response: httpx.Response, status: int, contains: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert contains.lower() in error["message"].lower()
    return error


CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "what is a KV cache"}]}


# --- shapes ---------------------------------------------------------------------------------


async def test_chat_completion_non_stream_shape():
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "fake-model" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "what is a KV cache "}
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    assert client.endings == ["finished"]


async def test_chat_stream_role_first_one_finish_usage_then_done():
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={
                **CHAT,
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert len({ch["id"] for ch in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    with_choices = [ch for ch in chunks if ch["choices"]]
    finishes = [
        ch["choices"][0]["finish_reason"]
        for ch in with_choices
        if ch["choices"][0]["finish_reason"]
    ]
    assert finishes == ["length"]
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
    contents = [ch["choices"][0]["delta"].get("content") for ch in with_choices[1:-1]]
    assert contents == ["what ", "is ", "a "]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert all("usage" not in ch for ch in chunks[:-1])


async def test_chat_stream_without_include_usage_has_no_usage_chunk():
    async with http(create_app(FakeClient())) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunks = [json.loads(p) for p in sse_payloads(r.text)[:-1]]
    assert all(ch["choices"] for ch in chunks) and all("usage" not in ch for ch in chunks)


async def test_chat_stream_skips_empty_deltas():
    def script(req):
        return [
            UserReply(uid=1, incremental_output=""),
            UserReply(uid=1, incremental_output="Hi"),
            UserReply(uid=1, incremental_output=""),
            UserReply(uid=1, incremental_output="", finished=True, finish_reason="stop"),
        ]

    async with http(create_app(FakeClient(script))) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
    deltas = [json.loads(p)["choices"][0]["delta"] for p in sse_payloads(r.text)[:-1]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hi"}, {}]


async def test_completion_non_stream_and_stream_shapes():
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post("/v1/completions", json={"prompt": "one two three", "max_tokens": 2})
        s = await c.post(
            "/v1/completions",
            json={"prompt": "one two", "stream": True, "stream_options": {"include_usage": True}},
        )
    body = r.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["model"] == "fake-model"
    assert (
        body["choices"][0]["text"] == "one two " and body["choices"][0]["finish_reason"] == "length"
    )
    assert body["usage"]["total_tokens"] == 5

    chunks = [json.loads(p) for p in sse_payloads(s.text)[:-1]]
    assert all(ch["object"] == "text_completion" for ch in chunks)
    assert [ch["choices"][0]["text"] for ch in chunks[:-1]] == ["one ", "two ", ""]
    assert [ch["choices"][0]["finish_reason"] for ch in chunks[:-1]] == [None, None, "stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


async def test_models_lists_the_served_model():
    async with http(create_app(FakeClient())) as c:
        r = await c.get("/v1/models")
    assert r.json() == {
        "object": "list",
        "data": [
            {
                "id": "fake-model",
                "object": "model",
                "created": r.json()["data"][0]["created"],
                "owned_by": "minisgl-chat",
                "max_model_len": 8192,
            }
        ],
    }


# --- what reaches the engine ----------------------------------------------------------------


async def test_request_fields_become_sampling_params_and_generate_request():
    client = FakeClient()
    async with http(create_app(client)) as c:
        await c.post(
            "/v1/chat/completions",
            json={
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "hello "},
                            {"type": "text", "text": "there"},
                        ],
                    },
                ],
                "max_tokens": 7,
                "max_completion_tokens": 9,
                "temperature": 0.7,
                "top_p": 0.9,
                "top_k": 20,
                "seed": 3,
                "stop": "\n",
                "ignore_eos": True,
                "chat_template_kwargs": {"enable_thinking": False},
                "logprobs": False,
                "user": "someone",  # unknown or unsupported fields are ignored
            },
        )
        await c.post("/v1/completions", json={"prompt": [1, 2, 3], "stop": ["a", "b"]})
        await c.post("/v1/completions", json={"prompt": [[4, 5]]})
        await c.post("/v1/completions", json={"prompt": ["just one"]})
    chat, ids, nested, single = client.requests
    assert chat.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    p = chat.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.ignore_eos) == (
        9,
        0.7,
        0.9,
        20,
        3,
        ["\n"],
        True,
    )
    assert ids.input_ids == [1, 2, 3] and ids.text is None and ids.params.stop == ["a", "b"]
    assert ids.params.max_tokens == DEFAULT_MAX_TOKENS and ids.params.is_greedy
    assert nested.input_ids == [4, 5]
    assert single.text == "just one"


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "route, body, contains",
    [
        ("/v1/chat/completions", {**CHAT, "n": 0}, "n must be between 1 and 128"),
        ("/v1/chat/completions", {**CHAT, "n": 129}, "n must be between 1 and 128"),
        ("/v1/chat/completions", {**CHAT, "n": 2, "best_of": 3}, "best_of is not supported"),
        ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": -5}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "top_p": 0}, "top_p"),
        ("/v1/chat/completions", {"model": "fake-model"}, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "not supported",
        ),
        ("/v1/completions", {"prompt": []}, "must not be empty"),
        ("/v1/completions", {"prompt": ["first", ""]}, "must not be empty"),
        ("/v1/completions", {"prompt": [[1, 2], []]}, "must not be empty"),
        ("/v1/completions", {"prompt": ["p"] * 129}, "at most 128 prompts"),
        ("/v1/completions", {"prompt": ["p"] * 20, "n": 7}, "more than 128 choices"),
    ],
)
async def test_bad_requests_are_400_in_openai_shape(route, body, contains):
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post(route, json=body)
    assert_openai_error(r, 400, contains)
    assert client.requests == []


async def test_malformed_json_is_400():
    async with http(create_app(FakeClient())) as c:
        r = await c.post(
            "/v1/chat/completions",
            content=b'{"messages": [',
            headers={"content-type": "application/json"},
        )
    assert_openai_error(r, 400, "invalid JSON")


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_refusal_is_400_even_when_streaming(stream):
    client = FakeClient(refuse_script)
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert_openai_error(r, 400, "context holds 8192")
    assert client.endings == ["finished"]


async def test_error_after_text_is_reported_in_the_stream():
    def script(req):
        return [
            UserReply(uid=1, incremental_output="partial"),
            UserReply(
                uid=1,
                incremental_output="",
                finished=True,
                finish_reason="error",
                error="worker died",
            ),
        ]

    async with http(create_app(FakeClient(script))) as c:
        s = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert s.status_code == 200
    assert json.loads(sse_payloads(s.text)[-2])["error"]["message"] == "worker died"
    assert assert_openai_error(r, 500, "worker died")["type"] == "server_error"


async def test_unknown_route_is_404_and_crash_is_500_without_traceback():
    class Broken(FakeClient):
        def generate(self, req):
            raise RuntimeError("secret internals")

    async with http(create_app(Broken()), raise_app_exceptions=False) as c:
        missing = await c.get("/v1/nothing")
        crash = await c.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(missing, 404)
    error = assert_openai_error(crash, 500)
    assert (
        "secret" not in crash.text
        and "Traceback" not in crash.text
        and error["type"] == "server_error"
    )


# --- API key, health, metrics ---------------------------------------------------------------


async def test_api_key_guards_v1_but_not_health_or_metrics():
    app = create_app(FakeClient(), api_key="s3cret")
    async with http(app) as c:
        missing = await c.post("/v1/chat/completions", json=CHAT)
        wrong = await c.get("/v1/models", headers={"Authorization": "Bearer nope"})
        basic = await c.get("/v1/models", headers={"Authorization": "Basic czNjcmV0"})
        garbage = await c.post(
            "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}
        )
        unknown = await c.get("/v1/unknown")
        right = await c.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": "bearer s3cret"}
        )
        health = await c.get("/health")
        metrics = await c.get("/metrics")
    for r in (missing, wrong, basic, garbage, unknown):
        assert assert_openai_error(r, 401, "API key")["code"] == "invalid_api_key"
    assert right.status_code == 200
    assert health.status_code == 200 and metrics.status_code == 200


async def test_health_is_503_until_ready():
    client = FakeClient(ready=False)
    async with http(create_app(client)) as c:
        starting = await c.get("/health")
        client.ready = True
        ready = await c.get("/health")
    assert (starting.status_code, starting.json()) == (503, {"status": "starting"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})


async def test_metrics_expose_latest_stats_under_exact_names():
    client = FakeClient()
    app = create_app(client)
    async with http(app) as c:
        before = (await c.get("/metrics")).text
        client.stats = StatsMsg(
            running=2,
            waiting=1,
            kv_pages_total=100,
            kv_pages_used=30,
            kv_pages_cached=20,
            kv_pages_free=50,
            prompt_tokens_total=1234,
            generation_tokens_total=567,
            requests_finished_total=8,
            requests_aborted_total=1,
            prefix_cache_hit_tokens_total=321,
            prompt_tokens_pending=4000,
        )
        client.pending_count = 3
        r = await c.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert (
        "minisgl_frontend_pending_requests 0.0" in before
        and "minisgl_running_requests" not in before
    )
    values = {
        line.split()[0]: float(line.split()[1])
        for line in r.text.splitlines()
        if not line.startswith("#")
    }
    assert values == {
        "minisgl_frontend_pending_requests": 3,
        "minisgl_running_requests": 2,
        "minisgl_waiting_requests": 1,
        "minisgl_kv_pages_total": 100,
        "minisgl_kv_pages_used": 30,
        "minisgl_kv_pages_cached": 20,
        "minisgl_kv_pages_free": 50,
        "minisgl_prompt_tokens_total": 1234,
        "minisgl_generation_tokens_total": 567,
        "minisgl_requests_finished_total": 8,
        "minisgl_requests_aborted_total": 1,
        "minisgl_prefix_cache_hit_tokens_total": 321,
        "minisgl_prompt_tokens_pending": 4000,
    }
    assert "# TYPE minisgl_prompt_tokens_total counter" in r.text
    assert "# TYPE minisgl_prefix_cache_hit_tokens_total counter" in r.text


# --- disconnects abort the request ------------------------------------------------------------


async def _call_and_disconnect(
    app, path: str, body: dict, leave_after_first_chunk: bool, spec_version: str = "2.3"
) -> list[dict]:
    """Drives the ASGI app directly (httpx's transport buffers whole responses): the client
    leaves after the first body chunk, or 0.2 s after sending the request."""
    gone = asyncio.Event()
    request_sent = False
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set() and spec_version >= "2.4":
            raise OSError("connection closed")
        sent.append(message)
        if (
            leave_after_first_chunk
            and message["type"] == "http.response.body"
            and message.get("body")
        ):
            gone.set()

    if not leave_after_first_chunk:
        asyncio.get_running_loop().call_later(0.2, gone.set)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }
    with anyio.fail_after(3):  # not wait_for: its extra task would hide a generator left open
        await app(scope, receive, send)
    return sent


LONG_CHAT = {"messages": [{"role": "user", "content": " ".join(["word"] * 200)}]}


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_stream_client_leaving_closes_upstream(spec_version):
    client = FakeClient(delay=0.02)
    start = time.monotonic()
    sent = await _call_and_disconnect(
        create_app(client),
        "/v1/chat/completions",
        {**LONG_CHAT, "stream": True},
        leave_after_first_chunk=True,
        spec_version=spec_version,
    )
    assert sent[0]["status"] == 200
    assert client.endings == ["aborted"] and client.pending_count == 0
    assert time.monotonic() - start < 1.0  # not after all 200 words (4 s)


async def test_stream_client_leaving_while_waiting_for_first_token_closes_upstream():
    def slow_start(req):
        return [UserReply(uid=1, incremental_output="")] * 100 + echo_script(req)

    client = FakeClient(slow_start, delay=0.02)
    start = time.monotonic()
    await _call_and_disconnect(
        create_app(client),
        "/v1/chat/completions",
        {**CHAT, "stream": True},
        leave_after_first_chunk=False,
    )
    assert client.endings == ["aborted"]
    assert time.monotonic() - start < 1.0  # not when the first token comes (2 s)


async def test_non_stream_client_leaving_cancels_upstream():
    client = FakeClient(delay=0.02)
    start = time.monotonic()
    await _call_and_disconnect(
        create_app(client),
        "/v1/completions",
        {"prompt": " ".join(["w"] * 200)},
        leave_after_first_chunk=False,
    )
    assert client.endings == ["aborted"] and client.pending_count == 0
    assert time.monotonic() - start < 1.0


async def test_stream_read_to_the_end_is_not_counted_as_abort():
    client = FakeClient()
    async with http(create_app(client)) as c:
        await c.post("/v1/completions", json={"prompt": "a b", "stream": True})
    assert client.endings == ["finished"]


# --- the official openai client -------------------------------------------------------------


def openai_client(app, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url="http://localhost/v1",
        http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)),
    )


async def test_openai_client_chat_non_stream_and_stream():
    app = create_app(FakeClient(), api_key="k")
    async with openai_client(app, api_key="k") as oc:
        done = await oc.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi there"}]
        )
        stream = await oc.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi there"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        models = await oc.models.list()
    assert (
        done.choices[0].message.content == "hi there " and done.choices[0].finish_reason == "stop"
    )
    assert done.usage.total_tokens == 4
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "hi there "
    assert chunks[-1].usage.completion_tokens == 2
    assert [m.id for m in models.data] == ["fake-model"]


async def test_openai_client_completions_and_errors():
    app = create_app(FakeClient(), api_key="k")
    async with openai_client(app, api_key="k") as oc:
        done = await oc.completions.create(
            model="fake-model", prompt="x y z", max_tokens=2, extra_body={"top_k": 5}
        )
        with pytest.raises(openai.BadRequestError, match="best_of is not supported"):
            await oc.completions.create(model="fake-model", prompt="x", n=2, best_of=2)
    async with openai_client(app, api_key="wrong") as oc:
        with pytest.raises(openai.AuthenticationError):
            await oc.models.list()
    assert done.choices[0].text == "x y " and done.choices[0].finish_reason == "length"


# --- the model field: only a served name --------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "route, body", [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "a b"})]
)
async def test_a_model_not_served_is_404_model_not_found(route, body, stream):
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post(route, json={**body, "model": "Qwen/Qwen3-0.6B", "stream": stream})
    error = assert_openai_error(r, 404)
    assert error == {
        "message": "The model `Qwen/Qwen3-0.6B` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert client.requests == []


async def test_a_request_without_model_is_answered_as_the_listed_model():
    async with http(create_app(FakeClient())) as c:
        chat = await c.post(
            "/v1/chat/completions", json={"messages": CHAT["messages"], "model": None}
        )
        streamed = await c.post("/v1/completions", json={"prompt": "a b", "stream": True})
    assert chat.json()["model"] == "fake-model"
    assert {json.loads(p)["model"] for p in sse_payloads(streamed.text)[:-1]} == {"fake-model"}


async def test_served_model_names_are_each_accepted_and_answered_as_the_first():
    client = FakeClient()
    app = create_app(client, served_model_names=("my-assistant", "gpt-4o-mini"))
    async with http(app) as c:
        models = await c.get("/v1/models")
        alias = await c.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o-mini"})
        first = await c.post(
            "/v1/completions", json={"prompt": "a b", "model": "my-assistant", "stream": True}
        )
        own_name = await c.post(
            "/v1/chat/completions", json=CHAT
        )  # the model's own name is no longer served
    assert [m["id"] for m in models.json()["data"]] == ["my-assistant"]
    assert alias.status_code == 200 and alias.json()["model"] == "my-assistant"
    assert {json.loads(p)["model"] for p in sse_payloads(first.text)[:-1]} == {"my-assistant"}
    assert (
        assert_openai_error(own_name, 404, "`fake-model` does not exist")["code"]
        == "model_not_found"
    )


async def test_openai_client_gets_not_found_for_a_model_not_served():
    async with openai_client(create_app(FakeClient())) as oc:
        for stream in (False, True):
            with pytest.raises(openai.NotFoundError) as chat:
                await oc.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=stream
                )
            with pytest.raises(openai.NotFoundError) as completion:
                await oc.completions.create(model="gpt-4o", prompt="hi", stream=stream)
            for raised in (chat.value, completion.value):
                assert (
                    raised.status_code == 404
                    and raised.code == "model_not_found"
                    and raised.param == "model"
                )
                assert raised.body["message"] == "The model `gpt-4o` does not exist."


# --- several choices: n > 1 and batched prompts ----------------------------------------------


async def test_n_choices_of_a_prompt_are_prefilled_once_then_seeded_apart():
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={**CHAT, "n": 3, "seed": 7, "temperature": 0.8, "max_tokens": 5},
        )
    body = r.json()
    assert r.status_code == 200, body
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
    warm, *choices = client.requests
    assert warm.params.max_tokens == 1 and warm.params.is_greedy, (
        "the prompt runs once first, for the radix cache"
    )
    assert [q.params.seed for q in choices] == [7, 8, 9] and all(
        q.params.temperature == 0.8 for q in choices
    )
    assert all(q.messages == warm.messages for q in choices)
    words = len(CHAT["messages"][-1]["content"].split())
    assert body["usage"]["prompt_tokens"] == words, "the prompt counts once"
    assert body["usage"]["completion_tokens"] == 3 * min(words, 5)


async def test_a_batch_of_prompts_gives_one_choice_per_prompt_in_order():
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post("/v1/completions", json={"prompt": ["a b c", "d e", "f"], "max_tokens": 8})
        ids = await c.post(
            "/v1/completions", json={"prompt": [[1, 2], [3]], "n": 2, "max_tokens": 8}
        )
    assert [ch["text"] for ch in r.json()["choices"]] == ["a b c ", "d e ", "f "]
    assert [ch["index"] for ch in r.json()["choices"]] == [0, 1, 2]
    assert r.json()["usage"] == {"prompt_tokens": 6, "completion_tokens": 6, "total_tokens": 12}
    assert [ch["text"] for ch in ids.json()["choices"]] == ["1 2 ", "1 2 ", "3 ", "3 "]
    assert ids.json()["usage"]["prompt_tokens"] == 3


async def test_streamed_choices_carry_their_index_and_finish_each():
    client = FakeClient(delay=0.001)
    async with http(create_app(client)) as c:
        r = await c.post(
            "/v1/completions",
            json={
                "prompt": ["a b c", "d e"],
                "stream": True,
                "max_tokens": 8,
                "stream_options": {"include_usage": True},
            },
        )
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: "a b c ", 1: "d e "} and finishes == {0: "stop", 1: "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


async def test_one_refused_choice_refuses_the_request_and_stops_the_others():
    def script(req: GenerateRequest) -> list[UserReply]:
        return refuse_script(req) if req.text == "too long" else echo_script(req)

    client = FakeClient(script, delay=0.01)
    async with http(create_app(client)) as c:
        r = await c.post(
            "/v1/completions", json={"prompt": ["a b c d e f g h", "too long"], "max_tokens": 8}
        )
        streamed = await c.post(
            "/v1/completions",
            json={"prompt": ["a b c d e f g h", "too long"], "max_tokens": 8, "stream": True},
        )
    assert_openai_error(r, 400, "context holds 8192")
    assert_openai_error(streamed, 400, "context holds 8192")
    assert sorted(client.endings) == ["aborted", "aborted", "finished", "finished"], client.endings


# --- reasoning content -------------------------------------------------------------------------


def test_the_reasoning_splitter_takes_the_think_block_whatever_the_chunking():
    from minisgl_engine.reasoning import ReasoningSplitter, split_reasoning

    text = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello! How can I help?"
    for size in (1, 2, 3, 5, 7, 100):
        splitter = ReasoningSplitter()
        reasoning, answer = "", ""
        for i in range(0, len(text), size):
            r, a = splitter.push(text[i : i + size])
            reasoning, answer = reasoning + r, answer + a
        r, a = splitter.flush()
        assert (reasoning + r, answer + a) == (
            "\nThe user greets me. I greet back.\n",
            "Hello! How can I help?",
        ), size
    assert split_reasoning("Just an answer, <think> mentioned later") == (
        None,
        "Just an answer, <think> mentioned later",
    )
    assert split_reasoning("<think>cut off by max_tok") == ("cut off by max_tok", "")
    assert split_reasoning("<thi") == (None, "<thi")
    assert split_reasoning("<think></think>\n\nAnswer") == ("", "Answer")


def thinking_script(req: GenerateRequest) -> list[UserReply]:
    pieces = ["<thi", "nk>\nLet me", " think.</th", "ink>\n", "\nThe answer", " is 4."]
    replies = [UserReply(uid=1, incremental_output=p) for p in pieces[:-1]]
    return replies + [
        UserReply(
            uid=1,
            incremental_output=pieces[-1],
            finished=True,
            finish_reason="stop",
            prompt_tokens=3,
            completion_tokens=6,
        )
    ]


async def test_a_thinking_models_reply_comes_as_reasoning_content_and_content():
    client = FakeClient(thinking_script)
    client.thinks = "model"
    async with http(create_app(client)) as c:
        whole = (await c.post("/v1/chat/completions", json=CHAT)).json()
        kept = (
            await c.post("/v1/chat/completions", json={**CHAT, "separate_reasoning": False})
        ).json()
        streamed = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
    message = whole["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (
        "\nLet me think.",
        "The answer is 4.",
    )
    assert "reasoning_content" not in kept["choices"][0]["message"]
    assert kept["choices"][0]["message"]["content"] == "".join(
        p.incremental_output for p in thinking_script(None)
    )
    deltas = [
        json.loads(line[6:])["choices"][0]["delta"]
        for line in streamed.text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    ]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "\nLet me think."
    assert "".join(d.get("content", "") for d in deltas) == "The answer is 4."
    assert all("<" not in d.get("content", "") + d.get("reasoning_content", "") for d in deltas)


async def test_a_model_without_think_blocks_keeps_its_text_whole():
    client = FakeClient(thinking_script)  # thinks = None: a "<think>" it writes is just text
    async with http(create_app(client)) as c:
        whole = (await c.post("/v1/chat/completions", json=CHAT)).json()
    assert whole["choices"][0]["message"]["content"].startswith("<think>")
    assert "reasoning_content" not in whole["choices"][0]["message"]


def test_only_a_template_with_think_blocks_makes_replies_split():
    from pathlib import Path

    from minisgl_engine.reasoning import template_thinks
    from minisgl_engine.weights.demo import demo_model_dir

    demo = Path(demo_model_dir()) / "chat_template.jinja"
    if demo.exists():
        assert not template_thinks(demo.read_text())
    qwen3_like = "{%- if enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    assert template_thinks(qwen3_like) and template_thinks({"default": qwen3_like})
    assert not template_thinks(None) and not template_thinks("")


# --- tool calls --------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_the_hermes_parser_finds_calls_whatever_the_chunking():
    from minisgl_engine.tool_calls import ToolCallParser

    text = (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    for size in (1, 3, 8, 1000):
        parser = ToolCallParser("hermes")
        content, calls = "", []
        for i in range(0, len(text), size):
            c, found = parser.push(text[i : i + size])
            content, calls = content + c, calls + found
        c, found = parser.flush()
        content, calls = content + c, calls + found
        assert content == "Let me check.", size
        assert [(call.name, json.loads(call.arguments)) for call in calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "Rome"}),
        ]


def test_what_is_not_a_call_stays_content():
    from minisgl_engine.tool_calls import parse_tool_calls

    assert parse_tool_calls("<tool_call>not json</tool_call> after", "hermes") == (
        "<tool_call>not json</tool_call> after",
        [],
    )
    assert parse_tool_calls("I use <tool_call> tags", "hermes") == ("I use <tool_call> tags", [])
    content, [call] = parse_tool_calls(
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "llama3"
    )
    assert content == "" and (call.name, json.loads(call.arguments)) == (
        "get_weather",
        {"city": "Oslo"},
    )
    assert parse_tool_calls("{not a call}", "llama3") == ("{not a call}", [])
    assert parse_tool_calls("Plain answer.", "llama3") == ("Plain answer.", [])


def tool_script(req: GenerateRequest) -> list[UserReply]:
    pieces = [
        "Checking.",
        "<tool_",
        'call>\n{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}\n</tool_call>',
    ]
    return [UserReply(uid=1, incremental_output=p) for p in pieces[:-1]] + [
        UserReply(
            uid=1,
            incremental_output=pieces[-1],
            finished=True,
            finish_reason="stop",
            prompt_tokens=5,
            completion_tokens=9,
        )
    ]


async def test_a_tool_call_comes_back_as_tool_calls_streamed_and_not():
    client = FakeClient(tool_script)
    client.tool_format = "hermes"
    body = {**CHAT, "tools": [WEATHER_TOOL]}
    async with http(create_app(client)) as c:
        whole = (await c.post("/v1/chat/completions", json=body)).json()
        streamed = await c.post("/v1/chat/completions", json={**body, "stream": True})
        unused = (await c.post("/v1/chat/completions", json={**body, "tool_choice": "none"})).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert client.requests[0].chat_template_kwargs == {"tools": [WEATHER_TOOL]}
    chunks = [
        json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")
    ]
    deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    [streamed_call] = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert streamed_call["index"] == 0 and streamed_call["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert client.requests[-1].chat_template_kwargs is None, (
        "tool_choice none: the tools stay out of the prompt"
    )
    assert (
        "tool_calls" not in unused["choices"][0]["message"]
        and unused["choices"][0]["finish_reason"] == "stop"
    )


@pytest.mark.parametrize(
    "body, contains",
    [
        (
            {"tools": [WEATHER_TOOL], "tool_choice": "sometimes"},
            "'auto', 'none', 'required' or a named function",
        ),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            },
            "not among the tools",
        ),
        ({"tool_choice": "required"}, "needs tools"),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "leave out response_format",
        ),
        ({"tools": [{"type": "function"}]}, "function"),
    ],
)
async def test_tool_requests_this_server_cannot_honour_are_400(body, contains):
    client = FakeClient()
    client.tool_format = "hermes"
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, **body})
    assert_openai_error(r, 400, contains)
    assert client.requests == []


@pytest.mark.parametrize("tool_format", ["hermes", "llama3"])
async def test_a_required_or_named_tool_choice_constrains_the_reply_to_a_call(tool_format):
    time_tool = {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    }
    client = FakeClient()
    client.tool_format = tool_format
    async with http(create_app(client)) as c:
        for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
            r = await c.post(
                "/v1/chat/completions",
                json={**CHAT, "tools": [WEATHER_TOOL, time_tool], "tool_choice": choice},
            )
            assert r.status_code == 200, r.text
    required, named = (req.params.grammar for req in client.requests)
    assert required.kind == named.kind == "tool_call"
    assert json.loads(required.spec) == {
        "format": tool_format,
        "tools": [
            {"name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]},
            {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
        ],
    }
    assert [t["name"] for t in json.loads(named.spec)["tools"]] == ["get_time"]
    assert client.requests[0].chat_template_kwargs["tools"], (
        "the tools are still laid out in the prompt"
    )


async def test_tools_for_a_model_without_tool_calls_get_the_default_tool_prompt():
    client = FakeClient()  # its template knows no tools (tool_format None)
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text
    [req] = client.requests
    assert req.messages[0]["role"] == "system" and "get_weather" in req.messages[0]["content"]
    assert "tools" not in (req.chat_template_kwargs or {})


def test_tool_turns_reach_the_template_as_transformers_reads_them():
    from minisgl_engine.api.openai_protocol import ChatCompletionRequest

    request = ChatCompletionRequest(
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ],
        tools=[WEATHER_TOOL],
    )
    [[req]] = request.generate_requests()
    assert req.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert req.messages[2] == {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"}
    assert req.chat_template_kwargs["tools"][0]["function"]["name"] == "get_weather"


def test_a_block_the_template_opened_is_reasoning_up_to_its_close():
    from minisgl_engine.reasoning import ReasoningSplitter, split_reasoning

    assert split_reasoning("Weighing it up.\n</think>\n\n42", opened=True) == (
        "Weighing it up.\n",
        "42",
    )
    assert split_reasoning("still thinking when cut off", opened=True) == (
        "still thinking when cut off",
        "",
    )
    splitter = ReasoningSplitter(opened=True)
    parts = [splitter.push(piece) for piece in ("Weigh", "ing.</th", "ink>\n", "42")] + [
        splitter.flush()
    ]
    assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == ("Weighing.", "42")


def test_the_thinking_mode_comes_from_what_the_generation_prompt_ends_with():
    from minisgl_engine.reasoning import thinking_mode

    class Tokenizer:
        def __init__(self, template: str, prompt: str) -> None:
            self.chat_template, self.prompt = template, prompt

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return self.prompt

    both_tags = "{{ '<think>' }}...{{ '</think>' }}"
    assert thinking_mode(Tokenizer(both_tags, "<|im_start|>assistant\n")) == "model"
    assert thinking_mode(Tokenizer(both_tags, "<|im_start|>assistant\n<think>\n")) == "template"
    assert thinking_mode(Tokenizer("no tags", "<|im_start|>assistant\n<think>\n")) is None
    assert thinking_mode(None) is None


@pytest.mark.parametrize(
    "route, extra, contains",
    [
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/chat/completions", {"best_of": 2}, "best_of"),
    ],
)
async def test_fields_not_supported_are_400_not_ignored(route, extra, contains):
    client = FakeClient()
    body = {**CHAT, **extra} if route.endswith("chat/completions") else {"prompt": "x", **extra}
    async with http(create_app(client)) as c:
        r = await c.post(route, json=body)
    assert_openai_error(r, 400, contains)
    assert client.requests == []


async def test_sampling_fields_reach_the_engine():
    from minisgl_engine.sampling_params import GrammarSpec

    client = FakeClient()
    chat = {
        "logprobs": True,
        "top_logprobs": 3,
        "frequency_penalty": 0.5,
        "presence_penalty": -1,
        "repetition_penalty": 1.1,
        "min_p": 0.1,
        "min_tokens": 2,
        "logit_bias": {"50": -100, "7": 2.5},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
    }
    async with http(create_app(client)) as c:
        assert (await c.post("/v1/chat/completions", json={**CHAT, **chat})).status_code == 200
        assert (
            await c.post("/v1/completions", json={"prompt": "x", "logprobs": 2, "regex": "[a-z]+"})
        ).status_code == 200
        assert (
            await c.post("/v1/completions", json={"prompt": "x", "ebnf": 'root ::= "a"'})
        ).status_code == 200
        assert (
            await c.post(
                "/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}}
            )
        ).status_code == 200
    params = [req.params for req in client.requests]
    assert (
        params[0].logprobs,
        params[0].top_logprobs,
        params[0].frequency_penalty,
        params[0].presence_penalty,
    ) == (True, 3, 0.5, -1.0)
    assert (
        params[0].repetition_penalty,
        params[0].min_p,
        params[0].min_tokens,
        params[0].logit_bias,
    ) == (1.1, 0.1, 2, {50: -100, 7: 2.5})
    assert params[0].grammar == GrammarSpec("json_schema", '{"type": "object"}')
    assert (params[1].logprobs, params[1].top_logprobs, params[1].grammar) == (
        True,
        2,
        GrammarSpec("regex", "[a-z]+"),
    )
    assert params[2].grammar == GrammarSpec("ebnf", 'root ::= "a"') and not params[2].logprobs
    assert params[3].grammar == GrammarSpec("json_object")


async def test_neutral_values_of_sampling_fields_and_stop_token_ids_pass():
    client = FakeClient()
    neutral = {
        "logprobs": False,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_p": 0,
        "logit_bias": {},
        "response_format": {"type": "text"},
        "stop_token_ids": [7, 8],
    }
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, **neutral})
    assert r.status_code == 200, r.text
    assert client.requests[0].params.stop_token_ids == [7, 8]


async def test_null_sampling_fields_mean_their_neutral_values():
    client = FakeClient()
    nulls = {
        "frequency_penalty": None,
        "presence_penalty": None,
        "repetition_penalty": None,
        "min_p": None,
        "min_tokens": None,
        "logprobs": None,
        "top_logprobs": None,
        "logit_bias": None,
        "response_format": None,
    }
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, **nulls})
    assert r.status_code == 200, r.text
    params = client.requests[0].params
    assert not params.changes_logits and not params.logprobs and params.grammar is None


@pytest.mark.parametrize("key", ["²", "-1", "1.5", " "])
async def test_logit_bias_keys_that_are_not_token_ids_are_400(key):
    async with http(create_app(FakeClient())) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "logit_bias": {key: 1}})
    assert_openai_error(r, 400, "logit_bias keys must be token ids")


async def test_the_prefill_before_n_choices_asks_for_nothing_the_choices_ask_for():
    """n > 1 runs the prompt once with one greedy token first: min_tokens (> its max_tokens of 1),
    a grammar or logprobs must not ride along (min_tokens would even refuse it)."""
    client = FakeClient()
    extras = {
        "n": 2,
        "max_tokens": 6,
        "min_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "frequency_penalty": 1,
        "response_format": {"type": "json_object"},
    }
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, **extras})
    assert r.status_code == 200, r.text
    prefill, *choices = [req.params for req in client.requests]
    assert prefill.max_tokens == 1 and not prefill.changes_logits and not prefill.logprobs
    assert len(choices) == 2 and all(
        p.min_tokens == 5 and p.logprobs and p.grammar is not None for p in choices
    )


async def test_a_constrained_reply_is_content_even_where_the_template_opens_a_think_block():
    def json_reply(req: GenerateRequest) -> list[UserReply]:
        return [
            UserReply(
                uid=1,
                incremental_output='{"a": 1}',
                finished=True,
                finish_reason="stop",
                completion_tokens=4,
            )
        ]

    client = FakeClient(json_reply)
    client.thinks = "template"
    async with http(create_app(client)) as c:
        constrained = (
            await c.post(
                "/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}}
            )
        ).json()
        free = (await c.post("/v1/chat/completions", json=CHAT)).json()
    assert constrained["choices"][0]["message"]["content"] == '{"a": 1}'
    assert "reasoning_content" not in constrained["choices"][0]["message"]
    assert free["choices"][0]["message"]["reasoning_content"] == '{"a": 1}', (
        "unconstrained, the opened block is reasoning"
    )


def test_continue_final_message_is_taken_at_the_top_level_too():
    """vLLM's and SGLang's top-level field (what the chat app's --remote sends for Continue) means
    what chat_template_kwargs {"continue_final_message": true} means here."""
    from minisgl_engine.api.openai_protocol import ChatCompletionRequest

    messages = [
        {"role": "user", "content": "Tell a story."},
        {"role": "assistant", "content": "Once"},
    ]
    top = ChatCompletionRequest(
        messages=messages, continue_final_message=True, add_generation_prompt=False
    )
    [[request]] = top.generate_requests()
    assert request.chat_template_kwargs == {"continue_final_message": True}
    [[plain]] = ChatCompletionRequest(
        messages=messages, continue_final_message=None
    ).generate_requests()
    assert not (plain.chat_template_kwargs or {}).get("continue_final_message")


def scored_script(req: GenerateRequest) -> list[UserReply]:
    """echo_script, whose first reply carries each prompt word's logprob when the request asks
    for prompt logprobs (and each word's own logprob when it asks for logprobs)."""
    replies = echo_script(req)
    words = _prompt_words(req)
    if req.params.logprobs:
        for reply in replies:
            reply.logprobs = [
                LogprobEntry(
                    reply.incremental_output, list(reply.incremental_output.encode()), -1.0
                )
            ]
    if req.params.prompt_logprobs is not None:
        top = [LogprobEntry("x", [120], -0.5)] * req.params.prompt_logprobs
        replies[0].prompt_logprobs = [
            LogprobEntry(
                f"{w} ", list(f"{w} ".encode()), None if i == 0 else -2.0, [] if i == 0 else top
            )
            for i, w in enumerate(words)
        ]
    return replies


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_puts_the_prompt_and_its_logprobs_before_the_completion(stream):
    client = FakeClient(scored_script)
    body = {"prompt": "a b c ", "max_tokens": 2, "logprobs": 1, "echo": True, "stream": stream}
    async with http(create_app(client)) as c:
        r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert client.requests[0].params.prompt_logprobs == 1
    if stream:
        choices = [choice for p in sse_payloads(r.text)[:-1] for choice in json.loads(p)["choices"]]
        text = "".join(c["text"] for c in choices)
        lps = [c["logprobs"] for c in choices if c["logprobs"]]
        tokens = [t for lp in lps for t in lp["tokens"]]
        token_logprobs = [v for lp in lps for v in lp["token_logprobs"]]
        offsets = [o for lp in lps for o in lp["text_offset"]]
        top = [t for lp in lps for t in lp["top_logprobs"]]
    else:
        choice = r.json()["choices"][0]
        text, lp = choice["text"], choice["logprobs"]
        tokens, token_logprobs, offsets, top = (
            lp["tokens"],
            lp["token_logprobs"],
            lp["text_offset"],
            lp["top_logprobs"],
        )
    assert text == "a b c a b "  # the prompt, then the completion (its first 2 words)
    assert tokens == ["a ", "b ", "c ", "a ", "b "]
    assert token_logprobs == [None, -2.0, -2.0, -1.0, -1.0]
    assert top[0] is None and top[1] == {"x": -0.5}
    assert offsets == [0, 2, 4, 6, 8]


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_max_tokens_0_is_the_prompt_alone(stream):
    client = FakeClient(scored_script)
    body = {
        "prompt": ["a b", "c d e"],
        "max_tokens": 0,
        "logprobs": 0,
        "echo": True,
        "n": 2,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    async with http(create_app(client)) as c:
        r = await c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert len(client.requests) == 4, (
        "no prefill before the choices: a scored prompt cannot use the cache"
    )
    assert all(
        req.params.max_tokens == 1 and req.params.prompt_logprobs == 0 for req in client.requests
    )
    if stream:
        payloads = [json.loads(p) for p in sse_payloads(r.text)[:-1]]
        choices = [choice for p in payloads for choice in p["choices"]]
        texts = {i: "".join(c["text"] for c in choices if c["index"] == i) for i in range(4)}
        tokens = {
            i: [
                t
                for c in choices
                if c["index"] == i and c["logprobs"]
                for t in c["logprobs"]["tokens"]
            ]
            for i in range(4)
        }
        reasons = {c["index"]: c["finish_reason"] for c in choices if c["finish_reason"]}
        usage = payloads[-1]["usage"]
    else:
        choices = r.json()["choices"]
        texts = {c["index"]: c["text"] for c in choices}
        tokens = {c["index"]: c["logprobs"]["tokens"] for c in choices}
        reasons = {c["index"]: c["finish_reason"] for c in choices}
        usage = r.json()["usage"]
    assert texts == {0: "a b", 1: "a b", 2: "c d e", 3: "c d e"}
    assert tokens == {
        0: ["a ", "b "],
        1: ["a ", "b "],
        2: ["c ", "d ", "e "],
        3: ["c ", "d ", "e "],
    }
    assert reasons == {i: "length" for i in range(4)}
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == 5


async def test_echo_without_logprobs_and_max_tokens_0_without_echo():
    client = FakeClient(scored_script)
    async with http(create_app(client)) as c:
        r = await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 1, "echo": True})
        assert (
            r.json()["choices"][0]["text"] == "a b ca "
            and r.json()["choices"][0]["logprobs"] is None
        )
        assert client.requests[0].params.prompt_logprobs is None, (
            "the prompt is not scored when no logprobs are asked for"
        )
        assert_openai_error(
            await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 0}),
            400,
            "max_tokens",
        )
        # token ids are echoed as the model's tokenizer spells them: a model without one cannot
        assert_openai_error(
            await c.post("/v1/completions", json={"prompt": [1, 2], "echo": True}), 400, "tokenizer"
        )


def test_a_chat_template_that_refuses_the_messages_is_a_request_error_for_server_and_llm():
    """One rule (tokenizer.chat_prompt_ids) for the tokenizer workers and the offline LLM: the
    template's own reason, never a traceback."""
    from types import SimpleNamespace

    import jinja2

    from minisgl_engine.errors import RequestError
    from minisgl_engine.llm import LLM
    from minisgl_engine.tokenizer import chat_prompt_ids

    class Strict:
        chat_template = "{{ raise_exception('Conversation roles must alternate') }}"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
            raise jinja2.TemplateError("Conversation roles must alternate user/assistant")

    with pytest.raises(
        RequestError,
        match="chat template rejected these messages: Conversation roles must alternate",
    ):
        chat_prompt_ids(Strict(), [{"role": "assistant", "content": "hi"}])
    with pytest.raises(RequestError, match="chat template rejected"):
        LLM.encode(SimpleNamespace(tokenizer=Strict()), "hi", chat=True)
    with pytest.raises(RequestError, match="no chat template"):
        LLM.encode(SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None)), "hi", chat=True)
