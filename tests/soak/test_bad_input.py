"""Bad input through a real server: invalid UTF-8 in the JSON body, lone surrogates, NUL bytes,
1 MB of text, 100 stop strings, many requests with one seed at once. Never a 5xx; refusals are
HTTP 400 in OpenAI's error shape; the server keeps serving and frees everything."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_utils import served_model
from soak_utils import assert_idle, chat_body, run, save_tiny_model_with_demo_vocab

from minisgl_engine.api.request_limits import MAX_STOP_STRINGS

FIGURES: dict[str, object] = {}


def post_raw(srv, content: bytes, timeout: float = 300) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/v1/chat/completions",
        content=content,
        headers={"Content-Type": "application/json"},
        timeout=timeout,
    )


def assert_openai_error(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err, err
    assert "Traceback" not in r.text
    return err["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_invalid_utf8_in_the_body_is_a_clean_400(soak_server, route):
    for raw in (
        b'{"prompt": "\xff\xfe\xc3(", "messages": [{"role": "user", "content": "a\xffb"}], "max_tokens": 4}',
        b"\xff\xff\xff",
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}], "max_tokens": 4}',
    ):
        r = httpx.post(
            f"{soak_server.url}{route}",
            content=raw,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert_openai_error(r)


@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogates_are_a_clean_400(soak_server, stream):
    for text in ("\\ud800", "a\\udfffb", "\\udc00\\ud800 hi"):
        raw = (
            '{"messages": [{"role": "user", "content": "'
            + text
            + f'"}}], "max_tokens": 4, "stream": {json.dumps(stream)}}}'
        ).encode()
        r = post_raw(soak_server, raw)
        # regression: these were HTTP 500 (UnicodeEncodeError when the front end encoded the message)
        assert "Unicode" in assert_openai_error(r)
    # a valid surrogate pair (escaped, as JSON writes an emoji) is served
    raw = b'{"messages": [{"role": "user", "content": "hi \\ud83d\\ude00"}], "max_tokens": 2}'
    assert post_raw(soak_server, raw).status_code == 200
    assert_idle(soak_server)


def test_nul_bytes_are_served(soak_server):
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions",
        json=chat_body("a\x00b\x00 what is \x00 this?", max_tokens=4),
        timeout=300,
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{soak_server.url}/v1/completions",
        json={"prompt": "\x00" * 50, "max_tokens": 4},
        timeout=300,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stream", [False, True])
def test_one_megabyte_of_text_is_a_clean_400_over_the_context(soak_server, stream):
    text = ("The quick brown fox jumps over the lazy dog. " * 23302)[: 1 << 20]
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions",
        json=chat_body(text, max_tokens=4, stream=stream),
        timeout=300,
    )
    msg = assert_openai_error(r)
    assert "context" in msg and "8192" in msg, msg
    assert_idle(soak_server)


def test_as_many_stop_strings_as_allowed_work_and_one_more_is_a_clean_400(soak_server):
    stops = [f"zq{i}x" for i in range(MAX_STOP_STRINGS - 1)] + ["Paris"]
    body = chat_body("What is the capital of France?", max_tokens=24, temperature=0)
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions", json={**body, "stop": stops}, timeout=300
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "Paris" not in choice["message"]["content"]
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions",
        json={**body, "stop": [*stops, "zqx"]},
        timeout=300,
    )
    assert "MAX_STOP_STRINGS" in assert_openai_error(r)


def test_many_requests_with_one_seed_at_once_agree(soak_server, scale):
    body = chat_body(
        "Invent a name for a cat.", max_tokens=12, temperature=1.0, top_p=0.95, seed=1234
    )

    async def main():
        async with httpx.AsyncClient(timeout=600) as client:
            rs = await asyncio.gather(
                *(
                    client.post(f"{soak_server.url}/v1/chat/completions", json=body)
                    for _ in range(scale.same_seed)
                )
            )
        return rs

    rs = run(main())
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    texts = {r.json()["choices"][0]["message"]["content"] for r in rs}
    FIGURES.update(same_seed_requests=scale.same_seed, distinct_outputs=len(texts))
    assert len(texts) == 1, texts
    assert_idle(soak_server)


@pytest.mark.parametrize(
    "route,body",
    [
        ("/v1/chat/completions", chat_body("hi", max_tokens=2, seed=2**70)),
        ("/v1/chat/completions", chat_body("hi", max_tokens=2, top_k=-(2**64))),
        ("/v1/completions", {"prompt": [1, 2**65], "max_tokens": 2}),
    ],
)
def test_integers_beyond_64_bits_are_a_clean_400(soak_server, route, body):
    """Regression: found by schemathesis — an integer msgpack cannot hold was HTTP 500
    (OverflowError when the front end encoded the message)."""
    r = httpx.post(f"{soak_server.url}{route}", json=body, timeout=120)
    assert_openai_error(r)


@pytest.mark.parametrize("role", ["", "User", "robot", "assistant "])
@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_chat_role_is_a_clean_400(soak_server, role, stream):
    """Regression: any role string was accepted ("" too, found by schemathesis) and rendered into
    the prompt verbatim by the chat template."""
    body = {
        "messages": [{"role": "user", "content": "hi"}, {"role": role, "content": "hello"}],
        "max_tokens": 2,
        "stream": stream,
    }
    r = httpx.post(f"{soak_server.url}/v1/chat/completions", json=body, timeout=60)
    msg = assert_openai_error(r)
    assert "messages.1.role" in msg and r.json()["error"]["param"] == "messages.1.role", msg


def test_every_openai_role_is_served_and_developer_means_system(soak_server):
    messages = [
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "tool", "content": "{}"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "And of Italy?"},
    ]
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    from minisgl_engine.api.openai_protocol import ChatCompletionRequest

    # Qwen3's chat template drops a message whose role it does not know: "developer" goes in as "system"
    [[request]] = ChatCompletionRequest(messages=messages[:1]).generate_requests()
    [first] = request.messages
    assert first == {"role": "system", "content": "Answer in one word."}


SHORT_CONTEXT = 256


@pytest.fixture(scope="module")
def short_context_server(tmp_path_factory):
    """A tiny random Llama whose context (256 tokens) is far below its KV pool (4096 tokens), so
    the context is the binding limit. Costs one ~8 s start instead of prefilling ~8k tokens of the
    demo model on a CPU."""
    from server_utils import ServerProcess

    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled (its tokenizer is used): run `minisgl-chat pull`")
    folder = tmp_path_factory.mktemp("short-context")
    save_tiny_model_with_demo_vocab(folder, SHORT_CONTEXT)
    srv = ServerProcess(
        "--model",
        str(folder),
        "--tokenizer",
        str(demo_model_dir()),
        "--max-kv-tokens",
        "4096",
        log_path=folder / "serve.log",
    )
    yield srv
    srv.stop()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("max_tokens", [10**6, SHORT_CONTEXT])
def test_max_tokens_beyond_the_models_context_is_clamped_with_finish_length(
    short_context_server, max_tokens, stream
):
    """The KV pool would hold 4096 tokens: only the model's context can stop this request."""
    srv = short_context_server
    assert srv.metrics()["minisgl_kv_pages_total"] > 4 * SHORT_CONTEXT
    body = chat_body(
        "ok " * 150,
        model=served_model(srv.url),
        max_tokens=max_tokens,
        ignore_eos=True,
        stream=stream,
        stream_options={"include_usage": True},
    )
    if stream:
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        [finish] = [
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]
        ]
        usage = chunks[-1]["usage"]
    else:
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        finish, usage = r.json()["choices"][0]["finish_reason"], r.json()["usage"]
    assert finish == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == SHORT_CONTEXT, usage
    assert_idle(srv)
