"""The OpenAI-compatible wire format's request bodies (the response bodies are in
openai_responses.py). A request body becomes the front end's :class:`~.frontend.GenerateRequest`
(``generate_requests``).

Request models only check types; values (temperature >= 0, top_p in (0, 1], ...) are checked once,
by :class:`SamplingParams`, so the HTTP routes and the offline engine refuse the same things.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator

from ..errors import RequestError
from ..sampling_params import GrammarSpec, SamplingParams
from ..tool_prompt import with_tool_prompt
from ..workers.frontend import GenerateRequest
from .request_limits import (
    MAX_LOGIT_BIAS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOOLS,
    check_count,
    check_generated_tokens,
    check_grammar,
    check_stop,
)

DEFAULT_MAX_TOKENS = 4096
"""Used when a request gives no max_tokens; the engine clamps it to what the context leaves."""
MAX_CHOICES = 128
"""Choices one request may ask for (prompts × n), OpenAI's own limit on n."""


# --- requests -------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class ContentPart(BaseModel):
    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content part type {value!r} is not supported (only 'text')")
        return value


ChatRole = Literal["system", "developer", "user", "assistant", "tool"]
"""The roles OpenAI accepts. Anything else ("", "User", "robot") is a 400: a chat template would
render an unknown role verbatim or silently drop the message."""


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallItem(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: ChatRole
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool's answer: which call it answers
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plain {role, content} dict a chat template expects; text parts are joined.
        "developer" (OpenAI's newer name for the system role) becomes "system", which every
        chat template knows (Qwen3's would drop a "developer" message). Tool calls go in as
        transformers' templates read them (arguments as an object)."""
        if isinstance(self.content, list):
            content = "".join(part.text or "" for part in self.content)
        else:
            content = self.content or ""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content,
        }
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _json_or_text(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class FunctionDefinition(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class _SamplingRequest(BaseModel):
    """Fields shared by both routes. Unknown fields are ignored, as OpenAI clients send many."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM, SGLang)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # extension
    n: int = 1  # choices per prompt, each sampled on its own (seed + its index when a seed is given; temperature 1 unless given)
    best_of: int | None = None
    stop_token_ids: list[int] | None = None  # extension (vLLM, SGLang)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # null (some clients send it) means the neutral value, as leaving the field out does
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None  # extension (vLLM, SGLang)
    min_p: float | None = None  # extension (vLLM, SGLang)
    min_tokens: int | None = None  # extension (vLLM, SGLang)
    logit_bias: dict[str, float] | None = (
        None  # token id (as a string, OpenAI's JSON) -> bias in [-100, 100]
    )
    response_format: dict[str, Any] | None = None  # text | json_object | json_schema
    regex: str | None = None  # extension (SGLang): the output matches this regular expression
    ebnf: str | None = (
        None  # extension (SGLang): the output matches this EBNF grammar (its rule "root")
    )

    @field_validator("stop")
    @classmethod
    def _stop_bounded(cls, value: str | list[str] | None) -> str | list[str] | None:
        check_stop(value)
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids_bounded(cls, value: list[int] | None) -> list[int] | None:
        check_count(len(value or []), MAX_STOP_TOKEN_IDS, "stop_token_ids", "MAX_STOP_TOKEN_IDS")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        check_count(len(value or {}), MAX_LOGIT_BIAS, "logit_bias entries", "MAX_LOGIT_BIAS")
        for key in value or {}:
            if not (key.strip().isascii() and key.strip().isdecimal()):
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        return value

    def grammar(self) -> GrammarSpec | None:
        """What the output must match: response_format, or SGLang's regex / ebnf fields (one)."""
        fmt = self.response_format or {}
        kind = fmt.get("type", "text")
        asked = [
            name
            for name, on in (
                ("response_format", kind != "text"),
                ("regex", self.regex is not None),
                ("ebnf", self.ebnf is not None),
            )
            if on
        ]
        if len(asked) > 1:
            raise RequestError(f"give one of {' and '.join(asked)}, not both")
        if self.regex is not None:
            return GrammarSpec("regex", self.regex)
        if self.ebnf is not None:
            return GrammarSpec("ebnf", self.ebnf)
        if kind == "text":
            return None
        if kind == "json_object":
            return GrammarSpec("json_object")
        if kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise RequestError(
                    "response_format json_schema needs json_schema.schema, a JSON schema object"
                )
            return GrammarSpec("json_schema", json.dumps(schema))
        raise RequestError(
            f"response_format type must be text, json_object or json_schema, got {kind!r}"
        )

    @field_validator("n")
    @classmethod
    def _choices(cls, value: int) -> int:
        if not 1 <= value <= MAX_CHOICES:
            raise ValueError(f"n must be between 1 and {MAX_CHOICES}")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(
                "best_of is not supported (it needs log-probabilities to rank choices); ask for n choices instead"
            )
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def choice_params(self) -> list[SamplingParams]:
        """One SamplingParams per choice: choice i of a seeded request samples with seed + i, so
        each choice is reproducible and differs from the others."""
        params = self.sampling_params()
        if (
            self.n > 1 and self.temperature is None
        ):  # n greedy choices would all be the same: OpenAI's default
            params = replace(params, temperature=1.0)
        if params.seed is None:
            return [params] + [replace(params) for _ in range(self.n - 1)]
        return [replace(params, seed=params.seed + i) for i in range(self.n)]

    def sampling_params(self) -> SamplingParams:
        """Raises RequestError for values the engine refuses."""
        max_tokens = self._max_tokens()
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=0.0 if self.temperature is None else self.temperature,
            top_k=-1 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            frequency_penalty=0.0 if self.frequency_penalty is None else self.frequency_penalty,
            presence_penalty=0.0 if self.presence_penalty is None else self.presence_penalty,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=0.0 if self.min_p is None else self.min_p,
            min_tokens=0 if self.min_tokens is None else self.min_tokens,
            logit_bias={int(token): bias for token, bias in (self.logit_bias or {}).items()},
            logprobs=self._logprobs()[0],
            top_logprobs=self._logprobs()[1],
            prompt_logprobs=self._prompt_logprobs(),
            grammar=self._bounded_grammar(),
        )

    def _bounded_grammar(self) -> GrammarSpec | None:
        grammar = self.grammar()
        check_grammar(grammar)  # before the engine sees it: a compile cannot be stopped once begun
        return grammar

    def check_generated_tokens(self, context: int | None) -> None:
        """All choices × max_tokens within MAX_GENERATED_TOKENS (each choice's counted as at
        most ``context``, the model's, which the engine clamps it to)."""
        max_tokens = self._max_tokens()
        check_generated_tokens(
            self.choices, DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens, context
        )

    @property
    def choices(self) -> int:
        return self.n

    def _logprobs(self) -> tuple[bool, int]:
        """(return logprobs, how many alternatives): each route spells it its own way."""
        return False, 0

    def _prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token when the prompt's logprobs are asked for (echo)."""
        return None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = (
        None  # extension (vLLM): the request's own template, only with --trust-request-chat-template
    )
    # extension (vLLM, SGLang): go on writing the last (assistant) message instead of starting a
    # new one; the same as chat_template_kwargs {"continue_final_message": true}
    continue_final_message: bool | None = None
    separate_reasoning: bool = (
        True  # extension (SGLang): a thinking model's <think> block as reasoning_content
    )
    tools: list[ToolDefinition] | None = None
    tool_choice: str | dict[str, Any] | None = (
        None  # "auto" (default with tools), "none", "required" or a named function
    )
    logprobs: bool | None = None
    top_logprobs: int | None = None  # 0-20 alternatives per token; needs logprobs

    def _logprobs(self) -> tuple[bool, int]:
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true")
        return bool(self.logprobs), self.top_logprobs or 0

    _tool_format: str | None = PrivateAttr(
        default=None
    )  # the model's tool-call convention, set by the route
    _tool_prompt: bool = PrivateAttr(default=False)  # tools laid out by tool_prompt.py

    @field_validator("tools")
    @classmethod
    def _tools_bounded(cls, value: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
        check_count(len(value or []), MAX_TOOLS, "tools", "MAX_TOOLS")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict | None) -> str | dict | None:
        if value in (None, "auto", "none", "required"):
            return value
        if isinstance(value, dict):
            name = (
                (value.get("function") or {}).get("name")
                if value.get("type") == "function"
                else None
            )
            if not isinstance(name, str):
                raise ValueError(
                    'a named tool_choice is {"type": "function", "function": {"name": ...}}'
                )
            return value
        raise ValueError(
            f"tool_choice must be 'auto', 'none', 'required' or a named function, got {value!r}"
        )

    @model_validator(mode="after")
    def _forced_tool_exists(self):
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise ValueError("tool_choice 'required' or a named function needs tools")
        if isinstance(self.tool_choice, dict):
            name = self.tool_choice["function"]["name"]
            if name not in [tool.function.name for tool in self.tools]:
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        return self

    def use_tool_format(self, tool_format: str, default_prompt: bool = False) -> None:
        """Calls are written in ``tool_format``; with ``default_prompt`` the model's template
        knows no tools, so the request lays them out itself (tool_prompt.py)."""
        self._tool_format, self._tool_prompt = tool_format, default_prompt

    def grammar(self) -> GrammarSpec | None:
        """With tool_choice 'required' or named, the reply is constrained to a call (the model's
        convention, arguments valid for the tool's schema)."""
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, dict)
        if not forced:
            return super().grammar()
        if super().grammar() is not None:
            raise RequestError(
                "tool_choice 'required' or a named function already constrains the reply; leave out response_format"
            )
        tools = (
            self.tools
            if self.tool_choice == "required"
            else [t for t in self.tools if t.function.name == self.tool_choice["function"]["name"]]
        )
        spec = {
            "format": self._tool_format,
            "tools": [
                {"name": t.function.name, "parameters": t.function.parameters or {"type": "object"}}
                for t in tools
            ],
        }
        return GrammarSpec("tool_call", json.dumps(spec))

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def _max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    def request_chat_template(self) -> str | None:
        """Where the request brings its own chat template (the field's name), None if it does not:
        a template is code the tokenizer runs, so only a server started with
        --trust-request-chat-template takes one (vLLM's rule)."""
        if self.chat_template is not None:
            return "chat_template"
        if "chat_template" in (self.chat_template_kwargs or {}):
            return "chat_template_kwargs.chat_template"
        return None

    def generate_requests(self) -> list[list[GenerateRequest]]:
        """The engine requests: one prompt, ``n`` choices."""
        messages = [message.to_dict() for message in self.messages]
        kwargs = self.chat_template_kwargs
        if self.chat_template is not None:
            kwargs = {**(kwargs or {}), "chat_template": self.chat_template}
        if self.continue_final_message:
            kwargs = {**(kwargs or {}), "continue_final_message": True}
        if self.uses_tools:
            tools = [tool.model_dump(exclude_none=True) for tool in self.tools]
            if self._tool_prompt:  # a template without tools: the default tool prompt
                messages = with_tool_prompt(messages, tools)
            else:  # the template lays the tools out in the prompt, in its model's convention
                kwargs = {**(kwargs or {}), "tools": tools}
        return [
            [
                GenerateRequest(params=params, messages=messages, chat_template_kwargs=kwargs)
                for params in self.choice_params()
            ]
        ]


class CompletionRequest(_SamplingRequest):
    """A prompt as text or token ids, or a batch of them (a list of strings or of id lists):
    one choice per prompt (``n`` with n > 1), in the prompts' order."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None  # the sampled token's logprob and this many alternatives (0-20)
    # the prompt before the completion, in the text and (with logprobs) the logprobs, each
    # prompt token scored by the model (the first gets null); with max_tokens 0, the prompt alone
    echo: bool = False
    suffix: str | None = None  # fill in the middle
    _NEUTRAL: ClassVar[dict[str, tuple]] = {"suffix": (None, "")}

    @model_validator(mode="after")
    def _nothing_unsupported(self):
        """Known fields this server cannot honour yet: asking for them is a 400 naming the
        field, never a reply that silently ignored it."""
        for name, allowed in self._NEUTRAL.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} is not supported by this server yet; leave it out")
        return self

    def _logprobs(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0

    def _prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo and self.logprobs is not None else None

    @property
    def prompt_only(self) -> bool:
        """echo with max_tokens 0: the prompt is scored and echoed, nothing is generated (the
        engine still samples one token, which is dropped)."""
        return self.echo and self.max_tokens == 0

    def _max_tokens(self) -> int | None:
        return 1 if self.prompt_only else self.max_tokens

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: str | list) -> str | list:
        if isinstance(value, str):
            return value
        batch = value if value and isinstance(value[0], (str, list)) else [value]
        if not batch or any(len(p) == 0 for p in batch):
            raise ValueError("prompt must not be empty")
        if len(batch) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} prompts per request")
        return value

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str):
            return [self.prompt]
        return list(self.prompt) if isinstance(self.prompt[0], (str, list)) else [self.prompt]

    def generate_requests(self) -> list[list[GenerateRequest]]:
        """The engine requests, per prompt its ``n`` choices."""
        if len(self.prompts) * self.n > MAX_CHOICES:
            raise RequestError(
                f"{len(self.prompts)} prompts × n={self.n} asks for more than {MAX_CHOICES} choices"
            )
        out = []
        for prompt in self.prompts:
            if isinstance(prompt, str):
                out.append(
                    [GenerateRequest(params=params, text=prompt) for params in self.choice_params()]
                )
            else:
                out.append(
                    [
                        GenerateRequest(params=params, input_ids=list(prompt))
                        for params in self.choice_params()
                    ]
                )
        return out
