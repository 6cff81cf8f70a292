"""This machine's engine and a remote side by side (`minisgl-chat --remote URL --local`): each
chat picks where its replies come from. The page's logic (ChatPage, ReplyManager) over a real
SQLite store, with the real SideBySide combining two stand-in sources; test_remote.py drives the
real thing in Chromium."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from minisgl_app.chat.reply_source import ModelEntry, ModelError, SideBySide
from minisgl_app.chat.settings_form import SettingsForm
from minisgl_app.chat.store import ConversationStore
from minisgl_app.chat.view import markdown_literal
from minisgl_engine.messages import UserReply

# system prompt, temperature, top-p, max tokens, thinking, top-k, seed, stop, repetition penalty
SETTINGS = SettingsForm(
    system_prompt="",
    temperature=0.0,
    top_p=1.0,
    max_tokens=64,
    thinking=False,
    top_k=0,
    seed=None,
    stop="",
    repetition_penalty=1.15,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Source:
    """A stand-in source named ``where``: its replies say where they come from, one word every
    ``step_s`` for ``words`` words, until stopped."""

    def __init__(self, where: str, models: list[str], step_s: float = 0.01, words: int = 5) -> None:
        self.where, self.models, self.step_s, self.words = where, models, step_s, words
        self.model_name = models[0]
        self.label = f"{where} box"
        self.ready = True
        self.supports_thinking = False
        self.asked = 0

    @property
    def backends(self) -> dict:
        return {self.where: self}

    def status_line(self) -> str:
        return f"**Ready** · {self.model_name} on the {self.where} box"

    async def list_models(self) -> list[ModelEntry]:
        return [
            ModelEntry(m, self.where, backend=self.where, serving=m == self.model_name)
            for m in self.models
        ]

    async def check_model(self, name: str) -> None:
        if name not in self.models:
            raise ModelError(f"{name} is not here")

    async def switch_model(self, name: str) -> None:
        await self.check_model(name)
        self.model_name = name

    async def generate(self, request, stop: asyncio.Event):
        self.asked += 1
        for i in range(self.words):
            if stop.is_set():
                return
            await asyncio.sleep(self.step_s)
            last = i == self.words - 1
            yield UserReply(
                1,
                f"{self.where}{i} ",
                finished=last,
                finish_reason="stop" if last else None,
                completion_tokens=i + 1,
            )


class Request:
    def __init__(self, session: str) -> None:
        self.session_hash = session


async def idle(page, *conv_ids: int) -> None:
    while any(page.replies.is_busy(c) for c in conv_ids):
        await asyncio.sleep(0.01)


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.sqlite3") as s:
        yield s


@pytest.mark.anyio
async def test_each_chat_gets_its_replies_from_the_backend_it_picked(store) -> None:
    from minisgl_app.page.ui import ChatPage

    local, remote = Source("local", ["tiny"]), Source("remote", ["big"])
    page = ChatPage(SideBySide(local, remote), store)
    tab = Request("tab-1")
    assert (
        list(page.source.backends) == ["local", "remote"]
        and page.fields(page.tab(tab))[-1] == "local"
    )
    # a chat on this machine (the default), then one on the remote, replying at once
    await page.send("hello", SETTINGS, None, tab)
    on_local = page.tab(tab).conv_id
    await page.new_chat(None, tab)
    await page.backend_changed("remote", tab)
    assert page.status_of(page.tab(tab)) == "**Ready** · big on the remote box"
    await page.send("hello", SETTINGS, None, tab)
    on_remote = page.tab(tab).conv_id
    await idle(page, on_local, on_remote)
    first, second = store.get(on_local).messages[-1], store.get(on_remote).messages[-1]
    assert first.content.startswith("local0") and first.model == "tiny", first
    assert second.content.startswith("remote0") and second.model == "big", second
    assert (local.asked, remote.asked) == (1, 1)
    # the chat keeps its backend through a change of its other settings, and New chat keeps the one shown
    await page.settings_changed(replace(SETTINGS, temperature=0.5), None, tab)
    assert (
        store.get(on_remote).settings.backend == "remote"
        and store.get(on_remote).settings.temperature == 0.5
    )
    assert (await page.new_chat(None, tab))[-1] == "remote"
    # a chat shown again shows its own backend and status line
    assert (await page.select(on_local, None, tab))[-1] == "local"
    assert page.status_of(page.tab(tab)) == "**Ready** · tiny on the local box"
    await page.send("again", SETTINGS, None, tab)
    await idle(page, on_local)
    assert store.get(on_local).messages[-1].content.startswith("local0") and (
        local.asked,
        remote.asked,
    ) == (2, 1)


@pytest.mark.anyio
async def test_a_switch_stops_only_the_replies_of_the_backend_it_switches(store) -> None:
    from minisgl_app.page.ui import ChatPage

    local, remote = (
        Source("local", ["tiny", "small"], words=1000),
        Source("remote", ["big", "huge"], words=1000),
    )
    page = ChatPage(SideBySide(local, remote), store)
    tab = Request("tab-1")
    await page.send("hello", SETTINGS, None, tab)
    on_local = page.tab(tab).conv_id
    await page.new_chat(None, tab)
    await page.backend_changed("remote", tab)
    await page.send("hello", SETTINGS, None, tab)
    on_remote = page.tab(tab).conv_id
    await asyncio.sleep(0.1)
    names = [e.name for e in await page.source.list_models()]
    assert names == ["tiny", "small", "remote: big", "remote: huge"], names
    said = [m async for m in page.switch_model("small", tab)]
    assert said[-1][0] == "Now serving **small**." and local.model_name == "small"
    await idle(page, on_local)
    assert store.get(on_local).messages[-1].stats.stopped_by == "switch to small"
    assert page.replies.is_busy(on_remote), "the remote's reply goes on"
    said = [m async for m in page.switch_model("remote: huge", tab)]
    assert remote.model_name == "huge", said
    # the panel marks what each backend serves; picking a model served already switches nothing
    marked = [label for label, _ in said[-1][1]["choices"] if label.startswith("● ")]
    assert marked == ["● small", "● remote: huge"], said[-1][1]["choices"]
    said = [m async for m in page.switch_model("remote: huge", tab)]
    # the name inside the sentence's Markdown shows as typed (view.markdown_literal escapes its colon)
    assert (
        len(said) == 1
        and said[0][0] == f"**{markdown_literal('remote: huge')}** is the model serving now."
    ), said
    await idle(page, on_remote)
    assert store.get(on_remote).messages[-1].stats.stopped_by == "switch to remote: huge"
    said = [m async for m in page.switch_model("remote: nothing", tab)]
    assert "cannot be served: nothing is not here" in said[-1][0], said


class UnlistedRemote(Source):
    """A remote whose models are not known until its first reply (RemoteEngine lists them then),
    and which a switch may move to another model while a reply streams."""

    def __init__(self) -> None:
        super().__init__("remote", ["big", "other"], step_s=0.02)
        self.model_name = None

    async def generate(self, request, stop: asyncio.Event):
        self.model_name = self.model_name or "big"
        async for out in super().generate(request, stop):
            yield out


@pytest.mark.anyio
async def test_a_reply_stores_the_model_that_answered_it_even_when_learnt_with_the_reply(
    store,
) -> None:
    from minisgl_app.page.ui import ChatPage

    local, remote = Source("local", ["tiny"]), UnlistedRemote()
    page = ChatPage(SideBySide(local, remote), store)
    tab = Request("tab-1")
    await page.backend_changed("remote", tab)
    await page.send("hello", SETTINGS, None, tab)
    conv = page.tab(tab).conv_id
    await idle(page, conv)
    assert store.get(conv).messages[-1].model == "big"
    # the remote moves to another model while the next reply streams: that reply was big's
    await page.send("again", SETTINGS, None, tab)
    while not store.get(conv).messages[-1].content:
        await asyncio.sleep(0.01)
    remote.model_name = "other"
    await idle(page, conv)
    assert store.get(conv).messages[-1].model == "big"
