"""Logprobs, penalties and structured output through a real server (the demo model, every
process over ZeroMQ), driven by the `openai` client: OpenAI's shapes, streamed and not; JSON
schemas (pydantic via `chat.completions.parse`, and 200 random ones that must validate), JSON
mode, regex and EBNF; clear 400s; and plain requests unchanged beside requests using each option."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from server_utils import served_model

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def api(demo_server):
    from openai import OpenAI

    return OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused", max_retries=0), served_model(
        demo_server.url
    )


def streamed(stream) -> tuple[str, list, str | None]:
    """(text, logprob entries, finish reason) of a one-choice chat stream."""
    text, entries, finish = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            entries += (
                choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
            )
            finish = choice.finish_reason or finish
    return text, entries, finish


def test_chat_logprobs_streamed_and_not(api):
    client, model = api
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=12, logprobs=True, top_logprobs=4
    )
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    shown = (
        entries[:-1] if choice.finish_reason == "stop" else entries
    )  # the end token adds no text
    assert b"".join(bytes(e.bytes) for e in shown).decode() == choice.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 4
        assert [t.logprob for t in e.top_logprobs] == sorted(
            (t.logprob for t in e.top_logprobs), reverse=True
        )
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(
            e.logprob
        ), "greedy: the likeliest"
    text, streamed_entries, finish = streamed(
        client.chat.completions.create(
            model=model,
            messages=QUESTION,
            max_tokens=12,
            logprobs=True,
            top_logprobs=4,
            stream=True,
        )
    )
    assert (text, finish) == (choice.message.content, choice.finish_reason)
    assert [e.token for e in streamed_entries] == [e.token for e in entries]
    assert [e.logprob for e in streamed_entries] == pytest.approx(
        [e.logprob for e in entries], abs=1e-4
    )
    plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12)
    assert (
        plain.choices[0].logprobs is None
        and plain.choices[0].message.content == choice.message.content
    )


def test_completion_logprobs_streamed_and_not(api):
    client, model = api
    reply = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, logprobs=3
    )
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(
        len(top) <= 3 and max(top.values()) == pytest.approx(v)
        for top, v in zip(lp.top_logprobs, lp.token_logprobs)
    )
    tokens, logprobs, text = [], [], ""
    for chunk in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, logprobs=3, stream=True
    ):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs:
                tokens += choice.logprobs.tokens
                logprobs += choice.logprobs.token_logprobs
    assert (text, tokens) == (reply.choices[0].text, lp.tokens)
    assert logprobs == pytest.approx(lp.token_logprobs, abs=1e-4)
    two = client.completions.create(
        model=model, prompt=["One, two,", "Red, green,"], max_tokens=4, logprobs=0, n=2, seed=1
    )
    assert len(two.choices) == 4 and all(
        len(c.logprobs.token_logprobs) == 4 and c.logprobs.top_logprobs == [{}] * 4
        for c in two.choices
    )


def test_completion_echo_scores_the_prompt_as_generation_does(api):
    """echo with logprobs: each prompt token's logprob is the one the model gives that token when
    generating it after the tokens before it (forced by logit_bias, which logprobs ignore);
    max_tokens 0 gives the prompt alone; streamed, the prompt comes before the completion."""
    from transformers import AutoTokenizer

    from minisgl_engine.weights.demo import demo_model_dir

    client, model = api
    text = "The capital of France is"
    ids = AutoTokenizer.from_pretrained(demo_model_dir()).encode(text)
    scored = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=2)
    choice = scored.choices[0]
    assert (choice.text, choice.finish_reason, scored.usage.completion_tokens) == (
        text,
        "length",
        0,
    )
    lp = choice.logprobs
    assert "".join(lp.tokens) == text and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(
        len(top) == 2 and max(top.values()) >= v
        for top, v in zip(lp.top_logprobs[1:], lp.token_logprobs[1:])
    )

    def generated_logprob(k: int) -> float:
        reply = client.completions.create(
            model=model, prompt=ids[:k], max_tokens=1, logprobs=0, logit_bias={str(ids[k]): 100}
        )
        assert reply.choices[0].logprobs.tokens == [lp.tokens[k]]
        return reply.choices[0].logprobs.token_logprobs[0]

    with ThreadPoolExecutor(4) as pool:
        expected = list(pool.map(generated_logprob, range(1, len(ids))))
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-3)

    plain = client.completions.create(model=model, prompt=text, max_tokens=6)
    streamed_text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt=text, max_tokens=6, echo=True, stream=True
        )
        if c.choices
    )
    assert streamed_text == text + plain.choices[0].text


class City:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
            "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        },
        "required": ["city", "country", "population"],
        "additionalProperties": False,
    }


def test_json_schema_parse_with_a_pydantic_model(api):
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        likes_cats: bool

    client, model = api
    reply = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        max_tokens=60,
    )
    assert isinstance(reply.choices[0].message.parsed, Person), reply.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_json_mode_regex_and_ebnf(api, stream):
    import jsonschema

    client, model = api

    def ask(max_tokens=80, **kw) -> str:
        if not stream:
            return (
                client.chat.completions.create(
                    model=model, messages=QUESTION, max_tokens=max_tokens, **kw
                )
                .choices[0]
                .message.content
            )
        return streamed(
            client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=max_tokens, stream=True, **kw
            )
        )[0]

    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": City.schema, "strict": True},
    }
    jsonschema.validate(json.loads(ask(response_format=fmt)), City.schema)
    assert isinstance(json.loads(ask(response_format={"type": "json_object"})), dict)
    assert re.fullmatch(
        r"(Paris|Lyon|Nice), France", ask(extra_body={"regex": r"(Paris|Lyon|Nice), France"})
    )
    answer = ask(extra_body={"ebnf": 'root ::= "The answer is " ("yes" | "no") "."'})
    assert answer in ("The answer is yes.", "The answer is no.")


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objec"}},
                }
            },
            'Unsupported type "objec"',
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format type must be"),
        ({"regex": "(unclosed"}, "invalid regex"),
        ({"ebnf": "root ::= missing_rule"}, "invalid ebnf"),
        ({"regex": "a", "response_format": {"type": "json_object"}}, "not both"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias token ids must be in"),
        ({"logit_bias": {"5": 500}}, "logit_bias values must be numbers in [-100, 100]"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer from 0 to 20"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
        ({"frequency_penalty": 3}, "frequency_penalty must be a number in [-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be a number in (0, 10]"),
        ({"min_p": 1.5}, "min_p must be a number in [0, 1]"),
        (
            {"min_tokens": 50, "max_tokens": 10},
            "min_tokens must be an integer from 0 to max_tokens",
        ),
    ],
)
def test_bad_options_are_a_400_that_says_what_is_wrong(api, body, message):
    import openai

    client, model = api
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=model,
                messages=QUESTION,
                stream=stream,
                **{"max_tokens": 8, **body_fields(body)},
                extra_body=extra_fields(body),
            )
        assert message in err.value.message, err.value.message
    ok = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=3)
    assert ok.choices[0].message.content, "the server still serves"


OPENAI_FIELDS = {
    "response_format",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "frequency_penalty",
    "max_tokens",
}


def body_fields(body: dict) -> dict:
    return {k: v for k, v in body.items() if k in OPENAI_FIELDS}


def extra_fields(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in OPENAI_FIELDS}


EXTRAS = {
    "logprobs": dict(logprobs=True, top_logprobs=5),
    "penalties": dict(
        frequency_penalty=1.0, presence_penalty=0.5, extra_body={"repetition_penalty": 1.3}
    ),
    "logit_bias": dict(logit_bias={"28": 5}),
    "min_tokens": dict(extra_body={"min_tokens": 20}),
    "min_p": dict(temperature=0.9, seed=3, extra_body={"min_p": 0.2}),
    "json_schema": dict(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": City.schema},
        }
    ),
    "regex": dict(extra_body={"regex": "[A-Z][a-z]+( [a-z]+){3,8}\\."}),
}


def test_plain_requests_are_unchanged_beside_requests_using_each_option(api):
    """One batch: a greedy and a seeded plain request beside two requests for each option
    (tests/unit/test_logits_processing.py checks each option on its own against transformers)."""
    client, model = api

    def plain(i: int) -> str:
        kw = {"temperature": 0.8, "seed": 7} if i else {}
        return (
            client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, **kw)
            .choices[0]
            .message.content
        )

    def extra(name: str) -> str:
        return (
            client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=24, **EXTRAS[name]
            )
            .choices[0]
            .message.content
        )

    def echoed(_: str) -> str:  # a scored prompt (its logits at every position)
        return (
            client.completions.create(
                model=model, prompt="Paris is the capital of", max_tokens=24, echo=True, logprobs=5
            )
            .choices[0]
            .text
        )

    alone = [plain(0), plain(1)]
    with ThreadPoolExecutor(2 * len(EXTRAS) + 4) as pool:
        extras = {name: [pool.submit(extra, name) for _ in range(2)] for name in EXTRAS}
        extras["echo"] = [pool.submit(echoed, "echo") for _ in range(2)]
        together = [pool.submit(plain, 0), pool.submit(plain, 1)]
        assert [f.result() for f in together] == alone
        assert all(f.result() is not None for fs in extras.values() for f in fs)


# --- 200 random JSON schemas -----------------------------------------------------------------

NAMES = st.sampled_from(["id", "name", "city", "score", "tags", "ok", "kind", "note"])
LEAVES = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 12)),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 1000),
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda values: {"enum": values},
        st.lists(
            st.sampled_from(["red", "green", "blue", "n/a", "x y"]),
            min_size=1,
            max_size=3,
            unique=True,
        ),
    ),
)


def _objects(children):
    return st.builds(
        lambda props: {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        },
        st.dictionaries(NAMES, children, min_size=1, max_size=3),
    )


def _arrays(children):
    return st.builds(
        lambda items, hi: {"type": "array", "items": items, "maxItems": hi},
        children,
        st.integers(0, 3),
    )


SCHEMAS = st.recursive(
    LEAVES, lambda children: st.one_of(_objects(children), _arrays(children)), max_leaves=6
).map(
    lambda s: (
        s
        if s.get("type") == "object"
        else {
            "type": "object",
            "properties": {"value": s},
            "required": ["value"],
            "additionalProperties": False,
        }
    )
)


def random_schemas(count: int) -> list[dict]:
    """``count`` different schemas drawn by hypothesis (generation only: no shrinking toward
    the simplest one, which is what a single drawn list would mostly repeat)."""
    found: dict[str, dict] = {}

    class Enough(Exception):
        """Raised once ``count`` are found: the remaining draws would only cost time (~10 s)."""

    @seed(20261130)
    @settings(
        max_examples=20 * count,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.generate],
    )
    @given(SCHEMAS)
    def collect(schema):
        found.setdefault(json.dumps(schema, sort_keys=True), schema)
        if len(found) >= count:
            raise Enough

    try:
        collect()
    except Enough:
        pass
    return list(found.values())[:count]


def test_200_random_schemas_give_json_that_validates(demo_server):
    """Greedy and sampled, all at once (the scheduler batches them)."""
    import jsonschema
    from openai import OpenAI

    schemas = random_schemas(200)
    assert len(schemas) == 200
    assert sum(json.dumps(s).count('"type": "object"') > 1 for s in schemas) > 40, (
        "nested objects are among them"
    )
    client = OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused", max_retries=0)
    model = served_model(demo_server.url)

    def ask(i: int) -> tuple[dict, str, str]:
        sampling = {"temperature": 0.9, "seed": i} if i % 2 else {}
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Fill in this form with an example."}],
            max_tokens=400,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "form", "schema": schemas[i], "strict": True},
            },
            **sampling,
        )
        return schemas[i], reply.choices[0].message.content, reply.choices[0].finish_reason

    with ThreadPoolExecutor(200) as pool:
        results = list(pool.map(ask, range(len(schemas))))
    for schema, text, finish in results:
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)
