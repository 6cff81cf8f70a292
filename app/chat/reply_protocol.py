"""What the chat page asks of whatever writes its replies (:class:`ReplySource`), and the
models panel's entries (:class:`ModelEntry`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from minisgl_engine import GenerateRequest, PromptProgressMsg, UserReply


@dataclass(frozen=True)
class ModelEntry:
    """One model the models panel lists; what is not known is None."""

    name: str  # what switch_model takes, and what the reply's store row remembers
    where: str  # "demo", "hub" (Hugging Face cache), "gguf" (converted), "serving", or "remote"
    size_bytes: int | None = None
    architecture: str | None = None
    context_len: int | None = None
    backend: str | None = (
        None  # which of the source's backends serves it (a switch stops that one's replies)
    )
    serving: bool = False  # the model its backend serves now (marked ● in the panel)


class ModelError(Exception):
    """A model cannot be served: the message says why, in words for the page."""


class ReplySource(Protocol):
    """What the chat page needs from whatever writes its replies."""

    @property
    def label(self) -> str:
        """Where its replies come from, in words ("This machine", "Remote · host:port")."""

    @property
    def backends(self) -> dict[str, ReplySource]:
        """The sources a chat can pick, by name: a chat's settings name one (``backend``; None or
        a name not here: the first). A plain source is its only backend."""

    @property
    def model_name(self) -> str | None:
        """The model replies come from now (None: not known yet)."""

    async def list_models(self) -> list[ModelEntry]:
        """The models the panel offers (never raises: a source that cannot list says so in
        ``ModelError`` from switch_model instead)."""

    async def check_model(self, name: str) -> None:
        """Raise ``ModelError`` if ``name`` cannot be switched to, checked while the current
        model keeps serving."""

    async def switch_model(self, name: str) -> None:
        """Serve ``name`` from now on; returns once it is ready. ``ModelError`` when it failed,
        after the previous model serves again."""

    @property
    def ready(self) -> bool:
        """Whether a message sent now is taken (else the page says the model is loading and
        keeps it in the box)."""

    @property
    def supports_thinking(self) -> bool:
        """Whether the model's chat template reads ``enable_thinking`` (the page shows the toggle)."""

    @property
    def context_len(self) -> int | None:
        """The serving model's context in tokens (None: not known), the most a reply can be."""

    @property
    def tool_wire(self):
        """How a chat's tools reach its model and its calls come back (tool_loop.ToolWire:
        EngineTools for this machine's engine, remote_wire.OpenAITools for a remote)."""

    def status_line(self) -> str:
        """The one line under the chat: the model, where it runs, its load or what is wrong."""

    def generate(
        self, request: GenerateRequest, stop: asyncio.Event
    ) -> AsyncIterator[UserReply | PromptProgressMsg]:
        """The reply, piece by piece (before it, maybe how far a long prompt has been read; a
        remote asked with tools, the calls it made: remote_wire.ToolCallsMade); ends early,
        unfinished, once ``stop`` is set."""
