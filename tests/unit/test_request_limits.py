"""What one request may ask of the engine (issue 41, security round 2): its own chat template
only where the server trusts them, templates stopped at a time limit, bounded bodies, stop
lists, logit biases, tools, grammars and prompts, each refused with a 400 (413 for a body) in
OpenAI's error shape before it reaches the engine."""

from __future__ import annotations

import pytest
from test_frontend import wired  # noqa: F401 (a fixture)
from test_openai_api import CHAT, FakeClient, assert_openai_error, http

from minisgl_engine.api.openai_api import create_app
from minisgl_engine.errors import RequestError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


LOOPING_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}"


# --- chat templates brought by a request ----------------------------------------------------


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {"chat_template_kwargs": {"chat_template": LOOPING_TEMPLATE}},
            "chat_template_kwargs.chat_template",
        ),
        ({"chat_template": LOOPING_TEMPLATE}, "chat_template"),
    ],
)
async def test_a_chat_template_from_the_request_is_400_unless_the_server_trusts_them(extra, param):
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, **extra})
    error = assert_openai_error(r, 400, "--trust-request-chat-template")
    assert (error["param"], error["code"]) == (param, "chat_template_not_allowed")
    assert client.requests == []  # nothing reached the engine

    trusting = FakeClient()
    async with http(create_app(trusting, trust_request_chat_template=True)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text
    assert trusting.requests[0].chat_template_kwargs["chat_template"] == LOOPING_TEMPLATE


async def test_other_chat_template_kwargs_still_pass():
    client = FakeClient()
    async with http(create_app(client)) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={**CHAT, "chat_template_kwargs": {"enable_thinking": False}},
        )
    assert r.status_code == 200, r.text
    assert client.requests[0].chat_template_kwargs == {"enable_thinking": False}


def test_the_flag_trusts_request_chat_templates():
    from minisgl_app.cli import build_parser, server_config_from_args

    assert not server_config_from_args(
        build_parser().parse_args(["serve"])
    ).trust_request_chat_template
    assert server_config_from_args(
        build_parser().parse_args(["serve", "--trust-request-chat-template"])
    ).trust_request_chat_template


@pytest.fixture(scope="module")
def demo_tokenizer():
    from minisgl_engine.tokenizer import load_tokenizer
    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    return load_tokenizer(demo_model_dir())


def test_a_looping_chat_template_is_stopped_at_the_time_limit_and_the_next_renders(demo_tokenizer):
    """10^10 loop turns (jinja's sandbox bounds each range, not loops in loops) end with a
    RequestError at the limit; the model's own template then renders as before."""
    from minisgl_engine.tokenizer import chat_prompt_ids

    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError, match="took longer than 0.5 s to render"):
        chat_prompt_ids(
            demo_tokenizer, messages, {"chat_template": LOOPING_TEMPLATE}, time_limit=0.5
        )
    assert chat_prompt_ids(demo_tokenizer, messages) == demo_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert chat_prompt_ids(
        demo_tokenizer, messages, {"chat_template": "{{ messages[0]['content'] }}"}
    ) == demo_tokenizer.encode("hi", add_special_tokens=False)


# --- /openapi.json --------------------------------------------------------------------------


async def test_openapi_json_needs_the_api_key_like_v1():
    async with http(create_app(FakeClient(), api_key="s3cret")) as c:
        missing = await c.get("/openapi.json")
        right = await c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
    assert assert_openai_error(missing, 401, "API key")["code"] == "invalid_api_key"
    assert right.status_code == 200 and "/v1/chat/completions" in right.json()["paths"]
    async with http(create_app(FakeClient())) as c:  # without a key (loopback), as before
        assert (await c.get("/openapi.json")).status_code == 200


# --- per-request caps -----------------------------------------------------------------------


SCHEMA_10K = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def required_object(count: int) -> dict:
    """An object of ``count`` properties, all required (short names: under MAX_GRAMMAR_CHARS)."""
    return {
        "type": "object",
        "properties": {f"{i:x}": {} for i in range(count)},
        "required": [f"{i:x}" for i in range(count)],
    }


def schema_format(schema: dict) -> dict:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def tool(name: str, parameters: dict | None = None) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "parameters": parameters or {"type": "object"}},
    }


@pytest.mark.parametrize(
    "route, extra, param, limit",
    [
        (
            "/v1/chat/completions",
            {"stop": [f"s{i}" for i in range(33)]},
            "stop",
            "MAX_STOP_STRINGS",
        ),
        ("/v1/completions", {"stop": "x" * 257}, "stop", "MAX_STOP_STRING_CHARS"),
        (
            "/v1/chat/completions",
            {"stop_token_ids": list(range(257))},
            "stop_token_ids",
            "MAX_STOP_TOKEN_IDS",
        ),
        (
            "/v1/chat/completions",
            {"logit_bias": {str(i): 1 for i in range(301)}},
            "logit_bias",
            "MAX_LOGIT_BIAS",
        ),
        (
            "/v1/chat/completions",
            {"tools": [tool(f"f{i}") for i in range(129)]},
            "tools",
            "MAX_TOOLS",
        ),
        ("/v1/chat/completions", {"n": 128, "max_tokens": 8192}, "n", "MAX_GENERATED_TOKENS"),
        (
            "/v1/completions",
            {"prompt": ["a", "b"], "n": 64, "max_tokens": 8000},
            "n",
            "MAX_GENERATED_TOKENS",
        ),
        (
            "/v1/chat/completions",
            schema_format(SCHEMA_10K),
            "response_format.json_schema.schema",
            "MAX_GRAMMAR_CHARS",
        ),
        (
            "/v1/chat/completions",
            schema_format({"type": "object", "properties": {f"p{i}": {} for i in range(513)}}),
            "response_format.json_schema.schema",
            "MAX_OPTIONAL_PROPERTIES",
        ),
        (
            "/v1/chat/completions",
            schema_format(required_object(2049)),
            "response_format.json_schema.schema",
            "MAX_SCHEMA_PROPERTIES",
        ),
        (
            "/v1/chat/completions",
            schema_format(nested(40)),
            "response_format.json_schema.schema",
            "MAX_SCHEMA_DEPTH",
        ),
        ("/v1/completions", {"regex": "a" * 65537}, "regex", "MAX_GRAMMAR_CHARS"),
        ("/v1/completions", {"ebnf": "root ::= " + '"a" ' * 20000}, "ebnf", "MAX_GRAMMAR_CHARS"),
        (
            "/v1/chat/completions",
            {
                "tools": [
                    tool(
                        f"f{i}", {"type": "object", "properties": {f"p{j}": {} for j in range(100)}}
                    )
                    for i in range(6)
                ],
                "tool_choice": "required",
            },
            "tools",
            "MAX_OPTIONAL_PROPERTIES",
        ),
    ],
)
async def test_requests_over_a_limit_are_400_naming_it_and_never_reach_the_engine(
    route, extra, param, limit
):
    client = FakeClient()
    client.tool_format = "hermes"
    body = {**CHAT, **extra} if route.endswith("chat/completions") else {"prompt": "hi", **extra}
    async with http(create_app(client)) as c:
        r = await c.post(route, json=body)
    error = assert_openai_error(r, 400, limit)
    assert error["param"] == param
    assert client.requests == []


@pytest.mark.parametrize(
    "route, extra",
    [
        (
            "/v1/chat/completions",
            {"stop": [f"s{i}" for i in range(32)], "stop_token_ids": list(range(256))},
        ),
        (
            "/v1/chat/completions",
            {"logit_bias": {str(i): 1 for i in range(300)}, "n": 128},
        ),  # n 128 with the default max_tokens
        (
            "/v1/chat/completions",
            {"n": 2, "max_tokens": 10**9},
        ),  # counted as the context's 8192 each
        ("/v1/chat/completions", {"tools": [tool(f"f{i}") for i in range(128)]}),
        (
            "/v1/chat/completions",
            schema_format(
                {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(512)}}
            ),
        ),
        (
            "/v1/chat/completions",
            schema_format(
                {
                    "type": "object",
                    "properties": {"a": required_object(1534), "b": required_object(512)},
                    "required": ["a", "b"],
                }
            ),
        ),  # 2,048 properties, all required
        ("/v1/chat/completions", schema_format(nested(20))),
    ],
)
async def test_requests_at_the_limits_pass(route, extra):
    client = FakeClient()
    client.tool_format = "hermes"
    async with http(create_app(client)) as c:
        r = await c.post(route, json={**CHAT, **extra})
    assert r.status_code == 200, r.text


# --- request bodies -------------------------------------------------------------------------


def big_chat(chars: int) -> bytes:
    import json

    return json.dumps({**CHAT, "messages": [{"role": "user", "content": "a" * chars}]}).encode()


async def test_a_body_over_the_limit_is_413_before_it_is_read():
    from minisgl_engine.api.request_limits import MAX_REQUEST_BYTES

    client = FakeClient()
    async with http(create_app(client)) as c:  # the default: 8 MiB
        r = await c.post(
            "/v1/chat/completions",
            content=big_chat(MAX_REQUEST_BYTES),
            headers={"content-type": "application/json"},
        )
    error = assert_openai_error(r, 413, "--max-request-bytes")
    assert error["code"] == "request_too_large" and f"{MAX_REQUEST_BYTES:,}" in error["message"]
    assert client.requests == []


async def test_a_chunked_body_is_cut_off_once_it_passes_the_limit():
    client = FakeClient()

    async def chunks():
        for _ in range(100):  # 100 × 1,000 bytes, no Content-Length
            yield b" " * 1000

    async with http(create_app(client, max_request_bytes=10_000)) as c:
        r = await c.post(
            "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
        )
    assert_openai_error(r, 413, "10,000 bytes")
    assert client.requests == []


async def test_a_body_within_the_limit_is_served():
    client = FakeClient()
    body = big_chat(5_000)
    async with http(create_app(client, max_request_bytes=len(body))) as c:
        r = await c.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        over = await c.post(
            "/v1/chat/completions",
            content=body + b" ",
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 200, r.text
    assert_openai_error(over, 413)


def test_max_request_bytes_is_a_server_flag():
    from minisgl_app.cli import build_parser, server_config_from_args
    from minisgl_engine import ServerConfig
    from minisgl_engine.api.request_limits import MAX_REQUEST_BYTES
    from minisgl_engine.errors import UserError

    assert (
        server_config_from_args(build_parser().parse_args(["serve"])).max_request_bytes
        == MAX_REQUEST_BYTES
        == ServerConfig().max_request_bytes
    )
    assert (
        server_config_from_args(
            build_parser().parse_args(["serve", "--max-request-bytes", "65536"])
        ).max_request_bytes
        == 65536
    )
    with pytest.raises(UserError, match="--max-request-bytes"):
        server_config_from_args(build_parser().parse_args(["serve", "--max-request-bytes", "0"]))


# --- the tokenizer: prompts too long in characters, requests whose client left --------------


class CountingEncoder:
    """Stands in for PromptEncoder: 'tokenizes' a text prompt as one id per word, and records it."""

    max_token_chars = 10

    def __init__(self) -> None:
        self.encoded: list[int] = []

    def encode(self, msg) -> list[int]:
        self.encoded.append(msg.uid)
        return [1] * len(msg.text.split())


def tokenize(uid: int):
    from minisgl_engine.messages import TokenizeMsg
    from minisgl_engine.sampling_params import SamplingParams

    return TokenizeMsg(uid, SamplingParams(max_tokens=4), text="a b c")


def abort(uid: int):
    from minisgl_engine.messages import AbortMsg

    return AbortMsg(uid)


def test_a_request_whose_abort_came_with_it_is_dropped_untokenized_and_so_is_the_abort():
    from minisgl_engine.messages import AbortBackendMsg, UserMsg
    from minisgl_engine.workers.tokenizer_worker import work_through

    encoder = CountingEncoder()
    forward, errors, carried = work_through(
        [tokenize(1), tokenize(2), abort(1), abort(3)], encoder, 1
    )
    assert encoder.encoded == [2]
    [to_scheduler] = forward
    assert [(type(m), m.uid) for m in to_scheduler] == [
        (UserMsg, 2),
        (AbortBackendMsg, 3),
    ]  # 3: sent earlier, aborted now
    assert errors == [] and carried == []


def test_an_abort_that_arrives_while_others_are_tokenized_spares_its_request():
    from minisgl_engine.messages import UserMsg
    from minisgl_engine.workers.tokenizer_worker import work_through

    encoder = CountingEncoder()
    arrivals = iter([[abort(3), tokenize(4)], [abort(1)], []])  # after request 1, after 2, after 4
    forward, _, carried = work_through(
        [tokenize(1), tokenize(2), tokenize(3)], encoder, 1, lambda: next(arrivals)
    )
    assert encoder.encoded == [1, 2]  # 3's client left while 1 was tokenized
    assert [(type(m), m.uid) for m in forward[0]] == [(UserMsg, 1), (UserMsg, 2)]
    # for the next turn: request 4, and request 1's abort (it went to the scheduler); not 3's
    assert [(type(m).__name__, m.uid) for m in carried] == [("TokenizeMsg", 4), ("AbortMsg", 1)]


def test_a_prompt_longer_in_characters_than_the_context_could_hold_is_refused_before_tokenizing(
    demo_tokenizer,
):
    from minisgl_engine.messages import TokenizeMsg
    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.tokenizer_worker import PromptEncoder

    class Watched:
        """The demo tokenizer, with a count of its encodes and renders."""

        def __init__(self) -> None:
            self.calls = 0
            self.chat_template = demo_tokenizer.chat_template

        def get_vocab(self):
            return demo_tokenizer.get_vocab()

        def encode(self, text):
            self.calls += 1
            return demo_tokenizer.encode(text)

        def apply_chat_template(self, *args, **kwargs):
            self.calls += 1
            return demo_tokenizer.apply_chat_template(*args, **kwargs)

    tokenizer = Watched()
    encoder = PromptEncoder(tokenizer, max_context_len=100)
    assert encoder.max_token_chars == max(len(t) for t in demo_tokenizer.get_vocab())
    most = 100 * encoder.max_token_chars
    params = SamplingParams(max_tokens=4)
    for msg in (
        TokenizeMsg(1, params, text="a" * (most + 1)),
        TokenizeMsg(
            2,
            params,
            messages=[
                {"role": "user", "content": "a" * (most // 2)},
                {"role": "user", "content": "a" * (most // 2 + 1)},
            ],
        ),
    ):
        with pytest.raises(
            RequestError,
            match=f"{most + 1:,} characters, more than the model's context of 100 tokens",
        ):
            encoder.encode(msg)
    assert tokenizer.calls == 0
    with pytest.raises(
        RequestError, match="the prompt is .* tokens long"
    ):  # within the bound: tokenized, then measured
        encoder.encode(TokenizeMsg(3, params, text="word " * 200))
    assert tokenizer.calls == 1


def test_the_front_end_refuses_such_a_prompt_before_sending_it(wired):
    import asyncio

    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.frontend import GenerateRequest

    client, tokenizer, _ = wired
    client.max_context_len = 100
    client.worker_info["minisgl-tokenizer-0"] = {"max_token_chars": 8}

    async def first(req):
        async def one():
            async for reply in client.generate(req):
                return reply

        return await asyncio.wait_for(
            one(), 10
        )  # the old front end sent it and waited for the tokenizer's answer

    with pytest.raises(RequestError, match="801 characters") as refused:
        asyncio.run(
            first(
                GenerateRequest(
                    params=SamplingParams(max_tokens=4),
                    messages=[{"role": "user", "content": "a" * 801}],
                )
            )
        )
    assert refused.value.param == "messages"
    assert not tokenizer.poll(200) and client.pending_count == 0  # nothing was sent


# --- grammar compiles in the scheduler ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from test_kvcache import _save_tiny_llama, make_llm

    folder = tmp_path_factory.mktemp("tiny-llama-limits")
    _save_tiny_llama(folder)
    return make_llm(folder)


class NeverCompiles:
    """A grammar compiler whose compiles never end (xgrammar's cannot be interrupted)."""

    def __init__(self) -> None:
        from concurrent.futures import Future

        self.futures: list[Future] = []

    def submit(self, spec):
        from concurrent.futures import Future

        self.futures.append(Future())
        return self.futures[-1]


def run_until_done(sched, uids: set[int], max_steps: int = 2000) -> dict:
    ends, tokens = {}, {uid: 0 for uid in uids}
    for _ in range(max_steps):
        for out in sched.step():
            tokens[out.uid] += out.token_id is not None
            if out.finished:
                ends[out.uid] = (out.finish_reason.value, out.error)
        if ends.keys() >= uids:
            return {uid: (*ends[uid], tokens[uid]) for uid in uids}
    raise AssertionError(f"not finished: {uids - ends.keys()}")


def test_a_grammar_not_compiled_by_its_deadline_fails_its_request_and_others_are_served(
    tiny_llm, monkeypatch
):
    from minisgl_engine.sampling_params import GrammarSpec, SamplingParams
    from minisgl_engine.scheduler import grammar_queue

    sched = tiny_llm.scheduler
    monkeypatch.setattr(grammar_queue, "GRAMMAR_COMPILE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(sched.grammar_queue, "compiler", NeverCompiles())
    sched.add_request(
        1, [5, 6, 7], SamplingParams(max_tokens=4, grammar=GrammarSpec("regex", "a+"))
    )
    sched.add_request(2, [5, 6, 8], SamplingParams(max_tokens=4, ignore_eos=True))
    ends = run_until_done(sched, {1, 2})
    assert ends[2] == ("length", None, 4)  # served while 1 waited
    reason, error, tokens = ends[1]
    assert (reason, tokens) == (
        "error",
        0,
    ) and "not compiled within 0.3 s (GRAMMAR_COMPILE_TIMEOUT_S)" in error
    assert not sched.reqs and not sched.grammar_queue.waiting and sched.stats().kv_pages_used == 0


def test_an_aborted_request_stops_waiting_for_its_compile(tiny_llm, monkeypatch):
    from minisgl_engine.sampling_params import GrammarSpec, SamplingParams

    sched = tiny_llm.scheduler
    compiler = NeverCompiles()
    monkeypatch.setattr(sched.grammar_queue, "compiler", compiler)
    sched.add_request(
        3, [5, 6, 7], SamplingParams(max_tokens=4, grammar=GrammarSpec("regex", "a+"))
    )
    sched.step()
    out = sched.abort_request(3)
    assert out is not None and out.finish_reason.value == "abort"
    assert not sched.reqs and not sched.grammar_queue.waiting and compiler.futures[0].cancelled()
