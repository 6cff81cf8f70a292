"""Tool calls through a real server: the demo model with a Qwen3-style chat template (tools in a
system block, calls in <tool_call> tags, tool answers in <tool_response>), driven by the
`openai` client. The demo model was not trained on this format, so what it writes is not under
test; what is: the tools and the tool turns reach the prompt through the real tokenizer worker,
and whatever comes back is either content or well-formed tool calls."""

from __future__ import annotations

import json
import shutil

import pytest
from server_utils import ServerProcess, served_model

QWEN3_STYLE_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city, now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLED = [
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
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    from minisgl_engine.weights.demo import demo_model_dir, is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    folder = tmp_path_factory.mktemp("qwen3-style-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir() / name, folder / name)
    (folder / "chat_template.jinja").write_text(QWEN3_STYLE_TEMPLATE)
    srv = ServerProcess(
        "--tokenizer", str(folder), "--max-kv-tokens", "4096", log_path=folder / "serve.log"
    )
    yield srv
    srv.stop()


def well_formed(message) -> bool:
    """Content, or tool calls whose arguments are JSON objects."""
    if message.tool_calls:
        return all(
            call.type == "function"
            and call.id
            and isinstance(json.loads(call.function.arguments), dict)
            for call in message.tool_calls
        )
    return message.content is not None


def calls_and_finish(client, kw: dict, stream: bool) -> tuple[list, str | None]:
    """A chat request's tool calls and finish reason, streamed (the deltas joined) or not."""
    if not stream:
        reply = client.chat.completions.create(**kw)
        return reply.choices[0].message.tool_calls or [], reply.choices[0].finish_reason
    calls, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    return calls, finish


def test_a_two_turn_tool_conversation(tool_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tool_server.url}/v1", api_key="unused")
    model = served_model(tool_server.url)
    plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=1)
    first = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=16, temperature=0
    )
    assert first.usage.prompt_tokens > plain.usage.prompt_tokens + 40, (
        "the tool's schema is in the prompt"
    )
    assert well_formed(first.choices[0].message)
    assert (first.choices[0].finish_reason == "tool_calls") == bool(
        first.choices[0].message.tool_calls
    )
    second = client.chat.completions.create(
        model=model, messages=QUESTION + CALLED, tools=[WEATHER_TOOL], max_tokens=16, temperature=0
    )
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 15, (
        "the call and its answer are in the prompt"
    )
    assert well_formed(second.choices[0].message)
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION + CALLED,
        tools=[WEATHER_TOOL],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    text, calls, finish = "", [], None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    assert text == (second.choices[0].message.content or "")
    assert [c.function.name for c in calls] == [
        c.function.name for c in second.choices[0].message.tool_calls or []
    ]
    assert finish == second.choices[0].finish_reason


def test_tool_choice_none_leaves_the_tools_out(tool_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{tool_server.url}/v1", api_key="unused")
    model = served_model(tool_server.url)
    plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=1)
    none = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=1
    )
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 32}},
            "required": ["timezone"],
        },
    },
}


def test_required_and_named_tool_choice_always_give_a_valid_call(tool_server):
    """The demo model was not trained to call tools; constrained by the grammar it always does,
    with arguments that match the tool's schema, greedy and sampled."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=f"{tool_server.url}/v1", api_key="unused")
    model = served_model(tool_server.url)
    cases = [
        ("required", {"get_weather", "get_time"}),
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
    ]
    schemas = {
        t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)
    }
    for (choice, allowed), stream in zip(
        cases, (False, True)
    ):  # each case streamed or not, in turn
        for sampling in ({}, {"temperature": 1.0, "seed": 4}):
            kw = dict(
                model=model,
                messages=QUESTION,
                tools=[WEATHER_TOOL, TIME_TOOL],
                tool_choice=choice,
                max_tokens=80,
                **sampling,
            )
            calls, finish = calls_and_finish(client, kw, stream)
            assert finish == "tool_calls" and len(calls) == 1, (choice, calls, finish)
            assert calls[0].function.name in allowed
            jsonschema.validate(
                json.loads(calls[0].function.arguments), schemas[calls[0].function.name]
            )


# ---- a model whose chat template knows no tools (the demo model's own): the default tool prompt


def test_a_template_without_tools_gets_them_in_the_default_tool_prompt(demo_server):
    """Tools, a tool turn and a forced call through the demo model's own template, which has no
    tools: the schemas and the turns reach the prompt (tool_prompt.py), a named or required
    choice returns a call whose arguments fit the schema, streamed as tool_calls deltas."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused")
    model = served_model(demo_server.url)
    plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=1)
    tools = [WEATHER_TOOL, TIME_TOOL]
    auto = client.chat.completions.create(
        model=model, messages=QUESTION, tools=tools, max_tokens=24, temperature=0
    )
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 80, "the schemas are in it"
    assert well_formed(auto.choices[0].message)
    answered = client.chat.completions.create(
        model=model, messages=QUESTION + CALLED, tools=tools, max_tokens=24, temperature=0
    )
    assert answered.usage.prompt_tokens > auto.usage.prompt_tokens + 15, "the call and answer"
    assert well_formed(answered.choices[0].message)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, stream in (("required", False), (named, True), (named, False)):
        kw = dict(model=model, messages=QUESTION, tools=tools, tool_choice=choice, max_tokens=80)
        calls, finish = calls_and_finish(client, kw, stream)
        assert finish == "tool_calls" and len(calls) == 1, (choice, calls, finish)
        name = calls[0].function.name
        assert name == "get_weather" or choice == "required", name
        schema = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[name]["function"]
        jsonschema.validate(json.loads(calls[0].function.arguments), schema["parameters"])
