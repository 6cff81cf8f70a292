"""Rendering a model's chat template the way transformers does, without importing it.

A chat template is Jinja code from the model's folder (or, with --trust-request-chat-template,
from a request). It runs in jinja2's ImmutableSandboxedEnvironment with the globals, filters
and extensions transformers gives it (``transformers/utils/chat_template_utils.py``), so the
same template renders the same prompt here and in transformers: ``raise_exception``,
``strftime_now``, a ``tojson`` that keeps non-ASCII text, a limited ``dict`` and ``namespace``,
loop controls, the ``{% generation %}`` block (rendered as its body), and trim_blocks /
lstrip_blocks. Everything a template sees is rebuilt from plain JSON types first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

MIN_JINJA2 = (3, 1, 6)  # older versions have known sandbox escapes; templates are untrusted code

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""Appended to the message ``continue_final_message`` leaves open, to find where it ends in the
rendered prompt (the prompt is cut there)."""

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning comes under; templates read the first (gpt-oss's read the second)."""


class ChatTemplateError(ValueError):
    """The messages or arguments cannot be rendered by this template."""


class GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` marks the assistant's text for training masks;
    rendering a prompt needs only its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """Jinja's own ``tojson`` escapes HTML characters; templates expect plain JSON."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format):
    return datetime.now().strftime(format)


class TemplateDict:
    """``dict(...)`` in a template, without the attributes of the ``dict`` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore names (a way towards CPython's internals)."""

    def __init__(*args, **kwargs):  # Jinja's own signature trick: ``namespace(self=...)`` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace ({name!r})"
            )


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in the sandbox (cached: a model's template is compiled once)."""
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < MIN_JINJA2:
        raise ImportError(f"chat templates need jinja2 >= 3.1.6, found {jinja2.__version__}")
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)


def plain_data(value: Any) -> Any:
    """A copy of ``value`` built from JSON types only; anything else becomes ``"<TypeName>"``
    (a template must not reach the methods of arbitrary objects)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    return f"<{type(value).__name__}>"


def select_template(own: str | dict[str, str] | None, given: str | None, tools: list | None) -> str:
    """The template to render: ``given`` (a template, or the name of one of the model's), else
    the model's own (``tool_use`` when there are tools and the model has one, else ``default``)."""
    if isinstance(own, dict):
        if given is not None and given in own:
            return own[given]
        if given is None:
            if tools is not None and "tool_use" in own:
                return own["tool_use"]
            if "default" in own:
                return own["default"]
            raise ChatTemplateError(
                f"this model has several chat templates and none is the default: {sorted(own)}"
            )
        return given
    if given is not None:
        return given
    if own is None:
        raise ChatTemplateError("this model has no chat template")
    return own


def with_reasoning_aliases(messages: list[dict]) -> list[dict]:
    """Each message's reasoning under ``reasoning_content`` (and ``thinking``), whichever name
    it came under."""
    aliased = []
    for message in messages:
        reasoning = next(
            (message[key] for key in REASONING_FIELDS if message.get(key) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def open_final_message(messages: list[dict], field: str, template: str) -> str:
    """Tag the end of the last message's ``field`` (in place) so the rendered prompt can be cut
    there; returns the text being continued."""
    if not messages:
        raise ChatTemplateError("continue_final_message is set but the conversation is empty")
    final = messages[-1].get(field)
    if final is None:
        raise ChatTemplateError(
            f'continue_final_message is set but the final message has no "{field}" to continue'
        )
    fields = [field]
    if field in REASONING_FIELDS:
        fields = [name for name in REASONING_FIELDS if messages[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ChatTemplateError(
            f'continue_final_message is set to "{field}" but the chat template does not read it'
        )
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                text = block["text"]
                block["text"] = text + CONTINUE_TAG
                return text
        raise ChatTemplateError(
            "continue_final_message is set but the final message has no text to continue"
        )
    for name in fields:
        messages[-1][name] = messages[-1][name] + CONTINUE_TAG
    return final


def cut_at_final_message(rendered: str, final: str) -> str:
    """The prompt up to the end of the continued message (its tag and what follows removed)."""
    if final.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the chat template dropped part of the final message"
        )
    at = rendered.rindex(CONTINUE_TAG.strip())
    if rendered[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space


def render_chat(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    variables: dict[str, Any] | None = None,
) -> str:
    """``messages`` rendered by ``template`` as a prompt. ``continue_final_message`` (True, or
    the field to continue) leaves the last message open; ``variables`` are the template's other
    inputs (the special tokens, ``enable_thinking``, …)."""
    if not messages:
        raise ChatTemplateError("cannot render an empty conversation")
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError(
            "continue_final_message and add_generation_prompt cannot be used together"
        )
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise ChatTemplateError("tools must be JSON schemas (dicts)")
    if documents is not None and not all(isinstance(doc, dict) for doc in documents):
        raise ChatTemplateError("documents must be dicts with 'title' and 'text' keys")
    chat = []
    for message in plain_data(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be dicts, got {message!r}")
        chat.append({key: value for key, value in message.items() if value is not None})
    chat = with_reasoning_aliases(chat)
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = open_final_message(chat, field, template)
    rendered = compile_template(template).render(
        messages=chat,
        tools=plain_data(tools),
        documents=plain_data(documents),
        add_generation_prompt=add_generation_prompt,
        **plain_data(variables or {}),
    )
    if final is not None:
        rendered = cut_at_final_message(rendered, final)
    return rendered
