"""The default tool prompt (engine/tool_prompt.py): a chat for a template without tools."""

from __future__ import annotations

import json

from minisgl_engine.tool_calls import parse_tool_calls
from minisgl_engine.tool_prompt import tool_prompt, with_tool_prompt

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}


def test_the_prompt_lists_each_schema_and_its_example_parses_as_a_call() -> None:
    prompt = tool_prompt([TOOL])
    assert json.dumps(TOOL["function"]) in prompt
    example = prompt[
        prompt.index("<tool_call>") : prompt.index("</tool_call>") + len("</tool_call>")
    ]
    content, calls = parse_tool_calls(example, "hermes")
    assert content == "" and [c.name for c in calls] == ["function_name"]


def test_a_chat_with_tool_turns_is_rewritten_for_a_template_without_tools() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "22 C"},
        {"role": "assistant", "content": "Paris 18 C, Rome 22 C."},
    ]
    out = with_tool_prompt(messages, [TOOL])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[0]["content"].startswith(tool_prompt([TOOL])) and out[0]["content"].endswith(
        "Be brief."
    )
    _, calls = parse_tool_calls(out[2]["content"], "hermes")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ] * 2
    assert out[3]["content"].count("<tool_response>") == 2 and "18 C" in out[3]["content"]
    assert all("tool_calls" not in m and "tool_call_id" not in m for m in out)
    assert messages[2]["tool_calls"], "the request's own messages are left as they were"


def test_a_chat_without_a_system_message_gets_one() -> None:
    out = with_tool_prompt([{"role": "user", "content": "hi"}], [TOOL])
    assert out == [
        {"role": "system", "content": tool_prompt([TOOL])},
        {"role": "user", "content": "hi"},
    ]
