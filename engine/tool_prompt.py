"""Tools for a model whose chat template knows none: the default tool prompt.

A chat template with tools (Qwen2.5/3, Llama 3.1, ...) lays the tools out and renders tool turns
in its model's own convention (tool_calls.py tells which). A template without them (the demo
model's, most small models') would drop both, so the request is rewritten before the template
sees it, in the ``hermes`` convention that tool_calls.py parses:

- the tools' JSON schemas and how to call them go at the start of the system message (one is
  added when the chat has none);
- an assistant turn that called tools carries its calls as ``<tool_call>{...}</tool_call>``
  text after its content;
- the answers of ``tool`` turns go back as one user turn of ``<tool_response>`` blocks, in the
  order of the calls they answer.

A model that was never trained on tools may still answer in prose (``tool_choice: auto``);
``required`` and a named function hold the reply to a valid call with the grammar
(openai_protocol.ChatCompletionRequest.grammar), as for templates with tools.
"""

from __future__ import annotations

import json
from typing import Any

from .tool_calls import CALL_END, CALL_START

DEFAULT_TOOL_FORMAT = "hermes"
RESPONSE_START, RESPONSE_END = "<tool_response>", "</tool_response>"  # a tool's answer


def tool_prompt(tools: list[dict[str, Any]]) -> str:
    """What the system message says about ``tools`` (OpenAI's ``tools`` entries)."""
    schemas = "\n".join(
        json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools
    )
    return (
        "You can call functions (tools) to help with the user's request. They are listed here, "
        "one JSON schema per line:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "To call one, reply with a JSON object holding its name and its arguments inside "
        f'tool_call tags, like this:\n{CALL_START}{{"name": "function_name", '
        f'"arguments": {{"argument": "value"}}}}{CALL_END}\n'
        "Write one such block per call. The results come back in tool_response tags. If no "
        "function helps, answer in plain text."
    )


def with_tool_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict]:
    """``messages`` (the template's plain dicts) rewritten for a template without tools."""
    out: list[dict[str, Any]] = []
    answers: list[str] = []  # the tool turns read so far, sent as one user turn

    def flush_answers() -> None:
        if answers:
            out.append({"role": "user", "content": "\n".join(answers)})
            answers.clear()

    for message in messages:
        role = message["role"]
        if role == "tool":
            answers.append(f"{RESPONSE_START}\n{message.get('content') or ''}\n{RESPONSE_END}")
            continue
        flush_answers()
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                CALL_START
                + json.dumps(
                    {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                    ensure_ascii=False,
                )
                + CALL_END
                for call in message["tool_calls"]
            ]
            text = "\n".join(filter(None, [message.get("content") or "", *calls]))
            message = {"role": "assistant", "content": text}
        out.append({k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")})
    flush_answers()
    prompt = tool_prompt(tools)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{prompt}\n\n{out[0].get('content') or ''}".rstrip()}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


__all__ = ["DEFAULT_TOOL_FORMAT", "tool_prompt", "with_tool_prompt"]
