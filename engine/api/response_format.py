"""What a completion route's response is made of: each choice whole (:class:`ChoiceResult`), and
the interface of a route's spelling of its response and stream chunks (:class:`ResponseFormat`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from pydantic import BaseModel

from ..messages import LogprobEntry, UserReply
from .openai_responses import UsageInfo, now


@dataclass
class ChoiceResult:
    """One choice, whole: its text, its final reply, its tokens' logprobs (None: not asked) and
    its prompt tokens' (echo)."""

    text: str
    final: UserReply
    logprobs: list[LogprobEntry] | None = None
    prompt_logprobs: list[LogprobEntry] | None = None


class ResponseFormat(ABC):
    """How one route spells its response and its stream chunks; ``index`` is the choice's."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.created = now()
        self.pending_logprobs: dict[int, list[LogprobEntry]] = {}  # choice -> logprobs not sent yet

    def add_logprobs(self, index: int, reply: UserReply) -> None:
        """Logprobs of tokens just out; they go with the choice's next chunk that carries text
        (a token may add no text yet: half a character, a held-back stop string or tag)."""
        entries = self.shown_logprobs(reply)
        if entries:
            self.pending_logprobs.setdefault(index, []).extend(entries)

    def shown_logprobs(self, reply: UserReply) -> list[LogprobEntry] | None:
        """What of a reply's logprobs this route shows."""
        return reply.logprobs

    def take_logprobs(self, index: int) -> list[LogprobEntry] | None:
        return self.pending_logprobs.pop(index, None)

    def opening(self, index: int) -> list[BaseModel]:
        return []

    @abstractmethod
    def text_chunks(self, index: int, text: str) -> list[BaseModel]: ...

    @abstractmethod
    def finish_chunks(self, index: int, finish_reason: str | None) -> list[BaseModel]: ...

    @abstractmethod
    def usage_chunk(self, usage: UsageInfo) -> BaseModel: ...

    @abstractmethod
    def response(self, choices: list[ChoiceResult], usage: UsageInfo) -> BaseModel:
        """``choices`` in index order."""
