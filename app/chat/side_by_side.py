"""Both reply sources at once (``--remote URL --local``): each chat picks its backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from minisgl_engine import GenerateRequest, PromptProgressMsg, UserReply

from .reply_protocol import ModelEntry, ReplySource

if (
    TYPE_CHECKING
):  # reply_source.py re-exports SideBySide, so it is imported from there for types only
    from .reply_source import LocalEngine, RemoteEngine


class SideBySide:
    """This machine's engine and a remote server at once (``--remote URL --local``). Each chat
    picks one in its settings (``backends``); the models panel lists the models of both, and a
    switch goes to the one that lists the model (remote names are prefixed ``REMOTE_PREFIX``, so
    that a model both have stays two entries). What the page asks of the app as a whole (the
    status line of a new chat, Pull) is the local engine's."""

    REMOTE_PREFIX = "remote: "

    def __init__(self, local: LocalEngine, remote: RemoteEngine) -> None:
        self.local, self.remote = local, remote

    @property
    def label(self) -> str:
        return f"{self.local.label} and {self.remote.label}"

    @property
    def backends(self) -> dict[str, ReplySource]:
        return {"local": self.local, "remote": self.remote}

    @property
    def model_name(self) -> str | None:
        return self.local.model_name

    async def list_models(self) -> list[ModelEntry]:
        remote = [
            replace(e, name=self.REMOTE_PREFIX + e.name) for e in await self.remote.list_models()
        ]
        return [*await self.local.list_models(), *remote]

    def _owner(self, name: str) -> tuple[ReplySource, str]:
        if name.startswith(self.REMOTE_PREFIX):
            return self.remote, name.removeprefix(self.REMOTE_PREFIX)
        return self.local, name

    async def check_model(self, name: str) -> None:
        source, own = self._owner(name)
        await source.check_model(own)

    async def switch_model(self, name: str) -> None:
        source, own = self._owner(name)
        await source.switch_model(own)

    @property
    def ready(self) -> bool:
        return self.local.ready

    @property
    def supports_thinking(self) -> bool:
        return self.local.supports_thinking

    @property
    def context_len(self) -> int | None:
        return self.local.context_len

    @property
    def tool_wire(self):
        return self.local.tool_wire  # a chat's own backend (``backends``) is asked, as for replies

    def status_line(self) -> str:
        return self.local.status_line()

    def generate(
        self, request: GenerateRequest, stop: asyncio.Event
    ) -> AsyncIterator[UserReply | PromptProgressMsg]:
        return self.local.generate(request, stop)
