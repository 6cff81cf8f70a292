"""What one HTTP request may ask of the engine. Each limit is checked in the front end, before
anything is sent to a worker, and a request over one is refused with a 400 (413 for a body) that
names it; the engine keeps serving everyone else.

The figures follow OpenAI's and vLLM's where they have one (logit_bias entries, tools, n), and
otherwise sit far above what a real client sends and far below what stalls a worker:

- a body is read only up to ``--max-request-bytes`` (:class:`BodyLimit`): a 100 MB message once
  drove the tokenizer to 12 GB;
- a grammar (JSON schema, regex, EBNF, the tools of a forced call) is bounded in text, in
  properties and in nesting (:func:`check_grammar`). xgrammar compiles a grammar in C++ that
  Python cannot interrupt (a 10,000-property schema ran on for 12 minutes after its client
  left), so bounding what can be compiled is what keeps every compile short: an object's
  optional properties cost about the square of their number (512: 0.4 s).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import RequestError
from ..sampling_params import GrammarSpec

MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Default for --max-request-bytes: the largest body /v1 reads (a context's worth of text is far less)."""
MAX_STOP_STRINGS = 32
"""Stop strings per request (OpenAI takes 4; clients with templates of their own send more)."""
MAX_STOP_STRING_CHARS = 256
"""Characters in one stop string (the detokenizer holds back that much text while matching)."""
MAX_STOP_TOKEN_IDS = 256
"""stop_token_ids per request."""
MAX_LOGIT_BIAS = 300
"""logit_bias entries per request: OpenAI's limit."""
MAX_TOOLS = 128
"""Tools per request: OpenAI's limit."""
MAX_GENERATED_TOKENS = 128 * 4096
"""Tokens one request may ask to generate in all: its choices (prompts × n) × max_tokens (each
counted as at most the model's context). The defaults, n up to 128 with no max_tokens, fit."""
MAX_GRAMMAR_CHARS = 64 * 1024
"""Characters of a JSON schema (as JSON), a regex or an EBNF grammar."""
MAX_SCHEMA_PROPERTIES = 2048
"""Properties in all the objects of one schema (or of a forced tool call's tools); required ones
compile in about linear time (2,000: 0.2 s)."""
MAX_OPTIONAL_PROPERTIES = 512
"""Of those, properties not in their object's ``required``: an object's optional properties cost
about the square of their number (512 in one object: 0.4 s; 10,000 ran for minutes)."""
MAX_SCHEMA_DEPTH = 64
"""JSON nesting of a schema document (an object property's schema is two levels below it)."""


class RequestTooLarge(HTTPException):
    """A body over the limit (413). An HTTPException, so FastAPI's body reading lets it through."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is larger than this server takes ({limit:,} bytes, --max-request-bytes)",
        )


class BodyLimit:
    """ASGI middleware: a /v1 request whose body is larger than ``limit`` bytes is answered 413,
    from its Content-Length before anything is read, or (a chunked body, or one longer than it
    said) as soon as the bytes read pass the limit; nothing more of it is read or kept."""

    def __init__(self, app: ASGIApp, limit: int, on_too_large) -> None:
        """``on_too_large(scope, receive, send, exc)`` sends the 413 (openai_api's error shape)."""
        self.app, self.limit, self.on_too_large = app, limit, on_too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _under_v1(scope):
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.limit:
            await self.on_too_large(scope, receive, send, RequestTooLarge(self.limit))
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise RequestTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


def _under_v1(scope: Scope) -> bool:
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == "/v1" or path.startswith("/v1/")


def check_count(count: int, limit: int, what: str, constant: str) -> None:
    """For a field validator: a ValueError (a 400 naming the field) past ``limit``."""
    if count > limit:
        raise ValueError(f"at most {limit} {what} per request ({constant}); got {count}")


def check_stop(stop: str | list[str] | None) -> None:
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    check_count(len(strings), MAX_STOP_STRINGS, "stop strings", "MAX_STOP_STRINGS")
    longest = max((len(s) for s in strings), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise ValueError(
            f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters (MAX_STOP_STRING_CHARS); got {longest}"
        )


def check_generated_tokens(choices: int, max_tokens: int, context: int | None) -> None:
    """``choices`` × ``max_tokens`` (each at most ``context``) within :data:`MAX_GENERATED_TOKENS`."""
    each = max_tokens if context is None else min(max_tokens, context)
    if choices * each > MAX_GENERATED_TOKENS:
        raise RequestError(
            f"{choices} choices × max_tokens {each} asks for more than {MAX_GENERATED_TOKENS:,} tokens "
            "(MAX_GENERATED_TOKENS); ask for fewer choices or fewer tokens",
            param="n",
        )


GRAMMAR_FIELDS = {
    "json_schema": "response_format.json_schema.schema",
    "regex": "regex",
    "ebnf": "ebnf",
    "tool_call": "tools",
}
"""The request field each kind of grammar comes from (the ``param`` of a refusal)."""


def check_grammar(spec: GrammarSpec | None) -> None:
    """Refuse a grammar whose compile could run long (see the module's docstring): its text,
    and for a JSON schema (a tool call's tools included) its properties and its nesting."""
    if spec is None or spec.spec is None:
        return
    param = GRAMMAR_FIELDS.get(spec.kind, spec.kind)
    if len(spec.spec) > MAX_GRAMMAR_CHARS:
        raise RequestError(
            f"{param}: the {spec.kind.replace('_', ' ')} has {len(spec.spec):,} characters; at most "
            f"{MAX_GRAMMAR_CHARS:,} (MAX_GRAMMAR_CHARS)",
            param=param,
        )
    if spec.kind not in ("json_schema", "tool_call"):
        return
    try:
        schema = json.loads(spec.spec)
    except ValueError:
        return  # the compiler says what is wrong with it
    properties, optional, depth = _schema_size(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise RequestError(
            f"{param}: the schema is nested more than {MAX_SCHEMA_DEPTH} levels deep (MAX_SCHEMA_DEPTH)",
            param=param,
        )
    if properties > MAX_SCHEMA_PROPERTIES:
        raise RequestError(
            f"{param}: the schema has {properties:,} properties; at most {MAX_SCHEMA_PROPERTIES:,} "
            "(MAX_SCHEMA_PROPERTIES)",
            param=param,
        )
    if optional > MAX_OPTIONAL_PROPERTIES:
        raise RequestError(
            f"{param}: the schema has {optional:,} optional properties (not in their object's required); at most "
            f"{MAX_OPTIONAL_PROPERTIES} (MAX_OPTIONAL_PROPERTIES)",
            param=param,
        )


def _schema_size(schema: Any) -> tuple[int, int, int]:
    """(properties of every object in it, those of them not required, the document's JSON
    nesting), without recursion."""
    properties = optional = depth = 0
    stack = [(schema, 1)]
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        if depth > MAX_SCHEMA_DEPTH:
            break
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                required = node.get("required") if isinstance(node.get("required"), list) else []
                properties += len(node["properties"])
                optional += len(
                    node["properties"].keys() - {name for name in required if isinstance(name, str)}
                )
            stack.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, level + 1) for child in node)
    return properties, optional, depth
