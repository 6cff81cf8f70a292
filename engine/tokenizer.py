"""Loading a model's tokenizer and turning a chat into prompt ids, kept apart from the engine so
that tokenizer processes start without loading the model code.

Two implementations satisfy :class:`TextTokenizer`: :class:`~.light_tokenizer.LightTokenizer`
(the ``tokenizers`` library and our chat-template rendering: what the tokenizer and detokenizer
workers and the front end use) and transformers' own tokenizer (folders the light one cannot
read; the offline ``LLM`` and the scheduler's grammars, which xgrammar builds from it)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class TextTokenizer(Protocol):
    """What the engine asks of a tokenizer (a subset of transformers' tokenizer interface)."""

    chat_template: str | dict[str, str] | None
    backend_tokenizer: Any  # the ``tokenizers.Tokenizer`` (its decoder tells byte-level BPE)

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def convert_ids_to_tokens(self, token_id: int) -> str | None: ...

    def get_vocab(self) -> dict[str, int]: ...

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> Any: ...


CHAT_TEMPLATE_TIME_LIMIT_S = 2.0
"""How long rendering one chat template may take. A model's own template renders a long chat in
milliseconds; a template that loops for longer (one a request brought, with
--trust-request-chat-template) is stopped, so the tokenizer goes on serving everyone else."""


class TemplateTimeout(Exception):
    """A chat template ran past :data:`CHAT_TEMPLATE_TIME_LIMIT_S`."""


@contextmanager
def template_deadline(seconds: float) -> Iterator[None]:
    """Stop any Jinja template rendered on this thread within the block once ``seconds`` have
    passed: Jinja compiles a template to Python code (its frames' file is ``<template>``), and a
    trace function on this thread checks the clock at each line those frames run, so loops of any
    depth are stopped (transformers renders in jinja2's ImmutableSandboxedEnvironment, which
    bounds each ``range`` to 100,000 items but not loops inside loops). Frames of other code are
    not traced, and the previous trace function (a debugger, coverage) is put back after."""
    end = time.monotonic() + seconds

    def in_template(frame, event, arg):
        if time.monotonic() > end:
            raise TemplateTimeout(f"the chat template took longer than {seconds:g} s to render")
        return in_template

    def on_call(frame, event, arg):
        return in_template if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)


def chat_prompt_ids(
    tokenizer,
    messages: list[dict],
    kwargs: dict | None = None,
    time_limit: float = CHAT_TEMPLATE_TIME_LIMIT_S,
) -> list[int]:
    """The token ids of ``messages`` in the model's chat template, with its generation prompt (the
    one way a chat becomes a prompt, for the server and the offline ``LLM``). A model without a
    template, messages its template refuses, or a template that renders for longer than
    ``time_limit`` seconds raise RequestError with the reason."""
    from .errors import RequestError

    kwargs = kwargs or {}
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "this model has no chat template; use /v1/completions with a plain prompt"
        )
    # continue_final_message: the last (assistant) message is left open so the model goes on
    # writing it (the chat's Continue), instead of starting a new turn
    add_generation_prompt = not kwargs.get("continue_final_message", False)
    try:
        with template_deadline(time_limit):
            out = tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
    except TemplateTimeout as exc:
        raise RequestError(f"{exc}; it was stopped (simplify the template)") from None
    except (
        Exception
    ) as exc:  # jinja2's TemplateError and friends: the messages don't fit the template
        raise RequestError(
            f"the chat template rejected these messages: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    return list(out)


def has_tokenizer(path) -> bool:
    return any((Path(path) / name).exists() for name in TOKENIZER_FILES)


def load_tokenizer(path):
    """The folder's tokenizer in transformers, or None when it ships none (e.g. a weights-only
    test model)."""
    from transformers import AutoTokenizer

    if not has_tokenizer(path):
        return None
    return AutoTokenizer.from_pretrained(path)


def load_text_tokenizer(path) -> TextTokenizer | None:
    """The folder's tokenizer without transformers where it can be (a ``tokenizer.json`` of a
    class transformers reads as it is: ``light_tokenizer.can_load``), else transformers' (a
    SentencePiece ``tokenizer.model`` or a ``vocab.json`` only, or a class with its own
    pipeline); None when the folder ships none."""
    from .light_tokenizer import LightTokenizer, can_load

    if not has_tokenizer(path):
        return None
    if can_load(path):
        return LightTokenizer(path)
    return load_tokenizer(path)
