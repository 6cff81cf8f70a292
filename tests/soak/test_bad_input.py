"""Bad input through a real server: invalid UTF-8 in the JSON body, lone surrogates, NUL bytes,
1 MB of text, 100 stop strings, many requests with one seed at once. Never a 5xx; refusals are
HTTP 400 in OpenAI's error shape; the server keeps serving and frees everything."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from soak_utils import assert_idle, chat_body, run

FIGURES: dict[str, object] = {}


def post_raw(srv, content: bytes, timeout: float = 300) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", content=content, headers={"Content-Type": "application/json"},
                      timeout=timeout)


def assert_openai_error(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err, err
    assert "Traceback" not in r.text
    return err["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_invalid_utf8_in_the_body_is_a_clean_400(soak_server, route):
    for raw in (b'{"model": "m", "prompt": "\xff\xfe\xc3(", "messages": [{"role": "user", "content": "a\xffb"}], "max_tokens": 4}',
                b"\xff\xff\xff", b'{"model": "m", "messages": [{"role": "user", "content": "\xed\xa0\x80"}], "max_tokens": 4}'):
        r = httpx.post(f"{soak_server.url}{route}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
        assert_openai_error(r)


@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogates_are_a_clean_400(soak_server, stream):
    for text in ("\\ud800", "a\\udfffb", "\\udc00\\ud800 hi"):
        raw = ('{"model": "m", "messages": [{"role": "user", "content": "' + text + '"}], "max_tokens": 4, "stream": %s}'
               % json.dumps(stream)).encode()
        r = post_raw(soak_server, raw)
        # regression: these were HTTP 500 (UnicodeEncodeError when the front end encoded the message)
        assert "Unicode" in assert_openai_error(r)
    # a valid surrogate pair (escaped, as JSON writes an emoji) is served
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi \\ud83d\\ude00"}], "max_tokens": 2}'
    assert post_raw(soak_server, raw).status_code == 200
    assert_idle(soak_server)


def test_nul_bytes_are_served(soak_server):
    r = httpx.post(f"{soak_server.url}/v1/chat/completions", json=chat_body("a\x00b\x00 what is \x00 this?", max_tokens=4), timeout=300)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{soak_server.url}/v1/completions", json={"model": "m", "prompt": "\x00" * 50, "max_tokens": 4}, timeout=300)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stream", [False, True])
def test_one_megabyte_of_text_is_a_clean_400_over_the_context(soak_server, stream):
    text = ("The quick brown fox jumps over the lazy dog. " * 23302)[: 1 << 20]
    r = httpx.post(f"{soak_server.url}/v1/chat/completions", json=chat_body(text, max_tokens=4, stream=stream), timeout=300)
    msg = assert_openai_error(r)
    assert "context" in msg and "8192" in msg, msg
    assert_idle(soak_server)


def test_one_hundred_stop_strings(soak_server):
    stops = [f"zq{i}x" for i in range(99)] + ["Paris"]
    body = chat_body("What is the capital of France?", max_tokens=24, temperature=0)
    r = httpx.post(f"{soak_server.url}/v1/chat/completions", json={**body, "stop": stops}, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "Paris" not in choice["message"]["content"]


def test_many_requests_with_one_seed_at_once_agree(soak_server, scale):
    body = chat_body("Invent a name for a cat.", max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)

    async def main():
        async with httpx.AsyncClient(timeout=600) as client:
            rs = await asyncio.gather(*(client.post(f"{soak_server.url}/v1/chat/completions", json=body) for _ in range(scale.same_seed)))
        return rs

    rs = run(main())
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    texts = {r.json()["choices"][0]["message"]["content"] for r in rs}
    FIGURES.update(same_seed_requests=scale.same_seed, distinct_outputs=len(texts))
    assert len(texts) == 1, texts
    assert_idle(soak_server)


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", chat_body("hi", max_tokens=2, seed=2**70)),
    ("/v1/chat/completions", chat_body("hi", max_tokens=2, top_k=-(2**64))),
    ("/v1/completions", {"model": "m", "prompt": [1, 2**65], "max_tokens": 2}),
])
def test_integers_beyond_64_bits_are_a_clean_400(soak_server, route, body):
    """Regression: found by schemathesis — an integer msgpack cannot hold was HTTP 500
    (OverflowError when the front end encoded the message)."""
    r = httpx.post(f"{soak_server.url}{route}", json=body, timeout=120)
    assert_openai_error(r)
