"""What /v1/completions adds to the chat route's path: its response spelling (text as ``text``,
``echo`` of the prompt) and the prompts as text to echo."""

from __future__ import annotations

import asyncio
import functools

from pydantic import BaseModel

from ..messages import LogprobEntry, UserReply
from .error_responses import APIError
from .openai_responses import (
    CompletionChoice,
    CompletionResponse,
    UsageInfo,
    completion_logprobs,
    new_id,
)
from .response_format import ChoiceResult, ResponseFormat


class CompletionFormat(ResponseFormat):
    """Completions: text as ``text``. With ``echo`` (the text of each prompt, choice i showing
    prompt i // n), a choice's text and logprobs begin with its prompt's; ``prompt_only`` (echo
    with max_tokens 0) shows the prompt alone."""

    def __init__(
        self, model: str, echo: list[str] | None = None, n: int = 1, prompt_only: bool = False
    ) -> None:
        super().__init__(model)
        self.id = new_id("cmpl")
        self.text_len: dict[int, int] = {}  # choice -> characters streamed so far (text_offset)
        self.echo, self.n, self.prompt_only = echo, n, prompt_only
        self.echoed: set[int] = set()  # choices whose prompt has been streamed

    def _make(
        self, choices: list[CompletionChoice], usage: UsageInfo | None = None
    ) -> CompletionResponse:
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def shown_logprobs(self, reply: UserReply) -> list[LogprobEntry] | None:
        return self._with_prompt(reply.prompt_logprobs, reply.logprobs)

    def _with_prompt(
        self, prompt: list[LogprobEntry] | None, generated: list[LogprobEntry] | None
    ) -> list[LogprobEntry] | None:
        """A choice's logprobs: its prompt's (with echo) before its generated tokens' (none with
        ``prompt_only``)."""
        generated = None if self.prompt_only else generated
        return generated if prompt is None else prompt + (generated or [])

    def _logprobs(self, index: int) -> dict | None:
        entries = self.take_logprobs(index)
        return completion_logprobs(entries, self.text_len.get(index, 0)) if entries else None

    def _prompt_text(self, index: int) -> str:
        """The prompt, the first time a choice sends anything (with echo)."""
        if self.echo is None or index in self.echoed:
            return ""
        self.echoed.add(index)
        return self.echo[index // self.n]

    def text_chunks(self, index: int, text: str) -> list[BaseModel]:
        text = self._prompt_text(index) + ("" if self.prompt_only else text)
        if not text:
            return []
        chunk = CompletionChoice(index=index, text=text, logprobs=self._logprobs(index))
        self.text_len[index] = self.text_len.get(index, 0) + len(text)
        return [self._make([chunk])]

    def finish_chunks(self, index: int, finish_reason: str | None) -> list[BaseModel]:
        text = self._prompt_text(index)
        reason = "length" if self.prompt_only else finish_reason
        return [
            self._make(
                [
                    CompletionChoice(
                        index=index, text=text, logprobs=self._logprobs(index), finish_reason=reason
                    )
                ]
            )
        ]

    def _usage(self, usage: UsageInfo) -> UsageInfo:
        return UsageInfo.of(usage.prompt_tokens, 0) if self.prompt_only else usage

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        return self._make([], self._usage(usage))

    def _choice(self, index: int, c: ChoiceResult) -> CompletionChoice:
        text = "" if self.prompt_only else c.text
        if self.echo is not None:
            text = self.echo[index // self.n] + text
        logprobs = self._with_prompt(
            c.prompt_logprobs if self.echo is not None else None, c.logprobs
        )
        return CompletionChoice(
            index=index,
            text=text,
            finish_reason="length" if self.prompt_only else c.final.finish_reason,
            logprobs=completion_logprobs(logprobs) if logprobs is not None else None,
        )

    def response(self, choices: list[ChoiceResult], usage: UsageInfo) -> BaseModel:
        return self._make([self._choice(i, c) for i, c in enumerate(choices)], self._usage(usage))


async def prompt_texts(tokenizer_path: str | None, prompts: list[str | list[int]]) -> list[str]:
    """The prompts as text, to echo: a text prompt as given, token ids decoded by the model's
    tokenizer (loaded here the first time a request needs it)."""
    if all(isinstance(p, str) for p in prompts):
        return list(prompts)
    tokenizer = await asyncio.to_thread(_tokenizer, tokenizer_path) if tokenizer_path else None
    if tokenizer is None:
        raise APIError(
            400,
            "echo of a prompt given as token ids needs the model's tokenizer, and this model has none",
            param="echo",
        )
    try:
        return [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    except Exception:  # an id outside the vocabulary (the engine would refuse it too)
        raise APIError(
            400, "prompt token ids must be ids of the model's vocabulary", param="prompt"
        ) from None


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str):
    from ..tokenizer import load_text_tokenizer

    return load_text_tokenizer(path)
