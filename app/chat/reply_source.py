"""Where the chat's replies come from: this machine's engine, or a remote OpenAI-compatible server.

The page talks to one interface, :class:`ReplySource`, and has no branch on which one it has:

- :class:`LocalEngine` wraps the engine's front end (``FrontendClient``): replies come over
  ZeroMQ from the tokenizer / scheduler / detokenizer processes started with the app.
- :class:`RemoteEngine` (``minisgl-chat --remote URL``) streams ``/v1/chat/completions`` from
  SGLang, vLLM or another minisgl-chat with the ``openai`` package's async client. Stop closes
  the stream (those servers abort a request whose client goes away); the figures under a reply
  come from the stream itself (first token, chunks, ``usage``); a remote's errors become a
  sentence in the chat, never a traceback.
- :class:`SideBySide` (``--remote URL --local``) holds both: each chat picks one of its
  ``backends`` in its settings.

Both yield the engine's :class:`UserReply` messages, which :class:`~.live.ReplyManager` reads;
the local engine also how far it has read a long prompt (``PromptProgressMsg``), which an
OpenAI stream has no place for.

The interface lives in reply_protocol.py, :class:`SideBySide` in side_by_side.py and the OpenAI
stream's details in remote_wire.py; every one of those names is importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from minisgl_engine import GenerateRequest, PromptProgressMsg, UserError, UserReply

from .remote_wire import (
    FINISHED,
    OpenAITools,
    ReasoningJoiner,
    ReplyTally,
    chat_body,
    remote_message,
    until_stopped,
    without_credentials,
)
from .reply_protocol import ModelEntry, ModelError, ReplySource
from .side_by_side import SideBySide
from .tool_loop import EngineTools
from .view import status_line

# the page, the CLI and the tests import these from here, whichever module defines them
__all__ = [
    "FINISHED",
    "LocalEngine",
    "ModelEntry",
    "ModelError",
    "ReasoningJoiner",
    "RemoteEngine",
    "ReplySource",
    "SideBySide",
    "chat_body",
    "chat_template_supports_thinking",
    "remote_message",
    "until_stopped",
    "without_credentials",
]

logger = logging.getLogger("minisgl.app")

REMOTE_CHECK_S = 5.0  # how often the remote's /v1/models is asked while a page is open
REMOTE_CONNECT_TIMEOUT_S = 5.0
REMOTE_READ_TIMEOUT_S = (
    300.0  # the longest wait for the next chunk (a long prefill on a busy server)
)
REMOTE_CHECK_TIMEOUT_S = 10.0  # the longest wait for /v1/models


class LocalEngine:
    """The engine started with the app (``FrontendClient`` over ZeroMQ); ``host`` (the engine's
    ``EngineHost``) restarts its workers with another model."""

    label = "This machine"

    def __init__(self, client, host=None) -> None:
        self.client = client
        self.host = host
        self.known: dict[
            str, object
        ] = {}  # name -> minisgl_engine.LocalModel, from the last listing
        self.checked: dict[str, object] = {}  # name -> the host's PreparedModel, from check_model

    @property
    def backends(self) -> dict[str, ReplySource]:
        return {"local": self}

    @property
    def model_name(self) -> str | None:
        return self.client.model_name

    async def list_models(self) -> list[ModelEntry]:
        from minisgl_engine import local_models

        try:
            found = await asyncio.to_thread(local_models)
        except Exception:  # noqa: BLE001 (an unreadable cache folder: the panel shows what it has)
            logger.exception("listing the local models failed")
            found = []
        self.known = {m.name: m for m in found}
        serving = self.client.model_name
        entries = [
            ModelEntry(
                m.name,
                m.kind,
                m.size_bytes,
                m.architecture,
                m.context_len,
                "local",
                m.name == serving,
            )
            for m in found
        ]
        if serving not in self.known:  # --model some/folder: served, though not in a cache
            entries.insert(
                0,
                ModelEntry(
                    serving,
                    "serving",
                    context_len=self.client.max_context_len,
                    backend="local",
                    serving=True,
                ),
            )
        return entries

    async def check_model(self, name: str) -> None:
        if self.host is None:
            raise ModelError("this engine cannot switch models")
        if self.host.switching:
            raise ModelError("another model switch is under way; wait for it to finish")
        if name not in self.known:
            await self.list_models()
        entry = self.known.get(name)
        if entry is None:
            raise ModelError(
                f"{name} is not on this machine (pull it first: minisgl-chat pull {name})"
            )
        try:
            self.checked[name] = await self.host.check(entry.model, name)
        except UserError as exc:
            raise ModelError(str(exc)) from None

    async def switch_model(self, name: str) -> None:
        if name not in self.checked:
            await self.check_model(name)
        if self.host.switching or not self.client.ready:
            raise ModelError(
                "another model switch is under way, or the model is still loading; try again once it is ready"
            )
        previous = self.client.model_name
        try:
            await self.host.switch(self.checked.pop(name))
        except UserError as exc:
            raise ModelError(f"{exc}. {previous} is serving again.") from None

    @property
    def ready(self) -> bool:
        return self.client.ready

    @property
    def supports_thinking(self) -> bool:
        return chat_template_supports_thinking(self.client.tokenizer_path)

    @property
    def context_len(self) -> int | None:
        return self.client.max_context_len

    @property
    def tool_wire(self) -> EngineTools:
        """How a chat's tools reach the model: in its prompt, as its chat template writes tool
        calls (``tool_format``; None: it knows no tools, and they go in the default tool prompt)."""
        return EngineTools(self.client.tool_format)

    def status_line(self) -> str:
        # asked by the page's tick: the tokenizer that counts prompts loads meanwhile
        if getattr(self.client, "ready", False):
            PROMPT_TOKENIZERS.load_soon(self.client.tokenizer_path)
        return status_line(self.client)

    def generate(
        self, request: GenerateRequest, stop: asyncio.Event
    ) -> AsyncIterator[UserReply | PromptProgressMsg]:
        return self.client.generate(request, stop, progress=True)

    def count_prompt_tokens(
        self, messages: list[dict], template_kwargs: dict | None, wait: bool = True
    ) -> int | None:
        """The prompt's length in tokens as the engine's tokenizers make it (the same tokenizer
        and chat template, loaded here once per model). None: this model has no tokenizer, or
        (``wait`` False: the meter) it has not loaded yet."""
        tokenizer = PROMPT_TOKENIZERS.get(self.client.tokenizer_path, wait)
        if tokenizer is None:
            return None
        from minisgl_engine import chat_prompt_ids

        return len(chat_prompt_ids(tokenizer, messages, template_kwargs))


class PromptTokenizers:
    """The served model's tokenizer in the front end, to count prompts: the light one (no torch
    or transformers in the front end) where the model allows, loaded once per model in a thread
    (transformers' took 5 s on a busy 2-core machine, which the page's event loop must not wait)."""

    def __init__(self) -> None:
        self.loaded: dict[str, object] = {}  # tokenizer folder -> tokenizer (None: it has none)
        self.lock = threading.Lock()
        self.loading: set[str] = set()

    def get(self, path: str | None, wait: bool):
        """The tokenizer of folder ``path``, loaded now if ``wait``, else None until a thread has."""
        if path is None:
            return None
        if path not in self.loaded and wait:
            self._load(path)
        elif path not in self.loaded:
            self.load_soon(path)
        return self.loaded.get(path)

    def load_soon(self, path: str | None) -> None:
        """Start loading ``path``'s tokenizer in a thread, unless it is loaded or loading."""
        if path is None or path in self.loaded or path in self.loading:
            return
        self.loading.add(path)
        threading.Thread(target=self._load, args=(path,), daemon=True).start()

    def _load(self, path: str) -> None:
        from minisgl_engine import load_text_tokenizer

        with self.lock:
            if path not in self.loaded:
                try:
                    self.loaded[path] = load_text_tokenizer(path)
                except Exception:  # noqa: BLE001 (no count: the chat is sent whole, the engine checks it)
                    logger.exception("loading the tokenizer of %s to count prompts failed", path)
                    self.loaded[path] = None
            self.loading.discard(path)


PROMPT_TOKENIZERS = PromptTokenizers()


@functools.lru_cache(maxsize=8)
def chat_template_supports_thinking(tokenizer_path: str | None) -> bool:
    """Qwen3-style templates read an `enable_thinking` variable; others ignore the toggle. (Asked
    at every turn: the template files are read once per tokenizer.)"""
    if tokenizer_path is None:
        return False
    folder = Path(tokenizer_path)
    texts = [
        p.read_text(errors="ignore")
        for p in (folder / "chat_template.jinja", folder / "tokenizer_config.json")
        if p.exists()
    ]
    return any("enable_thinking" in t for t in texts)


def is_transport_error(exc: BaseException) -> bool:
    """A connection that failed under the openai client without its wrapping: a stream cut in
    mid-body surfaces as the HTTP library's own error (httpx's; httpx2's for openai 3.x), not
    as openai.APIConnectionError."""
    import sys

    return any(
        isinstance(exc, module.TransportError)
        for module in (sys.modules.get("httpx"), sys.modules.get("httpx2"))
        if module is not None
    )


class RemoteEngine:
    """An OpenAI-compatible server elsewhere (SGLang, vLLM, another ``minisgl-chat serve``).

    ``model``: the one to ask for; by default the first that the remote's ``/v1/models`` lists.
    The remote is looked at again every ``REMOTE_CHECK_S`` while a page is open, so the status
    line follows it going away and coming back; a message sent while it is away gets the
    reason as its reply, and the next one (or Regenerate) tries again."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None) -> None:
        import openai

        self.url = url.rstrip("/").removesuffix("/v1")
        self.shown_url = without_credentials(self.url)  # what the page and the log may show
        self.chosen_model = model
        self.model_name: str | None = model
        self.models: list[str] = []
        self.context_lens: dict[
            str, int
        ] = {}  # max_model_len, where the remote says (vLLM, this engine)
        self.error: str | None = None
        self.checked_at = 0.0
        self._check: asyncio.Task | None = None
        self.client = openai.AsyncOpenAI(
            base_url=f"{self.url}/v1",
            api_key=api_key or "none",
            max_retries=0,
            timeout=openai.Timeout(REMOTE_READ_TIMEOUT_S, connect=REMOTE_CONNECT_TIMEOUT_S),
        )

    # ---- what the page reads

    @property
    def label(self) -> str:
        return f"Remote · {self.shown_url.split('://', 1)[-1]}"

    @property
    def backends(self) -> dict[str, ReplySource]:
        return {"remote": self}

    async def list_models(self) -> list[ModelEntry]:
        await self.check()
        return [
            ModelEntry(
                name,
                "remote",
                context_len=self.context_lens.get(name),
                backend="remote",
                serving=name == self.model_name,
            )
            for name in self.models
        ]

    async def check_model(self, name: str) -> None:
        await self.check()
        if self.error is not None and not self.models:
            raise ModelError(f"the remote at {self.shown_url}: {self.error}")
        if name not in self.models:
            raise ModelError(
                f"the remote at {self.shown_url} does not serve `{name}` (it serves {', '.join(self.models) or 'nothing'})"
            )

    async def switch_model(self, name: str) -> None:
        await self.check_model(name)
        self.chosen_model = self.model_name = name  # the next requests ask for it
        self.error = None

    @property
    def ready(self) -> bool:
        return True  # a message is always taken: if the remote fails it, the reply says why, and the next one retries

    @property
    def supports_thinking(self) -> bool:
        return False  # a remote's chat template is not visible from here; its reasoning still shows

    @property
    def context_len(self) -> int | None:
        return (
            self.context_lens.get(self.model_name) if self.model_name else None
        )  # where the remote lists it

    @property
    def tool_wire(self) -> OpenAITools:
        """A chat's tools are the page's; the remote's model gets them as OpenAI ``tools``."""
        return OpenAITools()

    def status_line(self) -> str:
        self._look_again()
        if self.error is not None:
            return f"**Remote unavailable** · {self.shown_url}: {self.error} (trying again every {REMOTE_CHECK_S:.0f} s)"
        if self.model_name is None:
            return f"**Connecting** to {self.shown_url}…"
        return f"**Remote** · {self.model_name} at {self.shown_url}"

    def _look_again(self) -> None:
        """Ask the remote for its models again when the last answer is old (from the page's tick)."""
        if self._check is not None and not self._check.done():
            return
        if time.monotonic() - self.checked_at < REMOTE_CHECK_S:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to schedule on
            self._check = asyncio.get_running_loop().create_task(self.check())

    async def check(self) -> None:
        """The remote's models; sets ``error`` to what went wrong when it does not answer.
        Never raises: whatever is at the address, the page gets a sentence."""
        self.checked_at = time.monotonic()
        try:
            listed = await self.client.models.list(timeout=REMOTE_CHECK_TIMEOUT_S)
            models = [m.id for m in listed.data]
            self.context_lens = {
                m.id: n
                for m in listed.data
                if isinstance(n := getattr(m, "max_model_len", None), int)
            }
        except Exception as exc:  # noqa: BLE001 (an HTML page at the address, a 404, a refused connection: all said in words)
            self.error = self.describe(exc, listing=True)
            return
        self.models = models
        if self.chosen_model is not None and self.chosen_model not in self.models:
            self.error = f"it does not serve `{self.chosen_model}` (it serves {', '.join(self.models) or 'nothing'})"
            return
        self.model_name = self.chosen_model or (self.models[0] if self.models else None)
        self.error = None if self.model_name is not None else "it lists no models"

    def describe(self, exc: BaseException, listing: bool = False, mid_reply: bool = False) -> str:
        """A remote's failure as a sentence saying what to do."""
        import openai

        if isinstance(exc, openai.AuthenticationError):
            return "it refused the API key (HTTP 401): check --remote-api-key"
        if isinstance(exc, openai.NotFoundError):
            if listing:
                return "it has no /v1/models (HTTP 404): is this the address of an OpenAI-compatible server?"
            return f"it does not serve model `{self.model_name}` (HTTP 404)"
        if isinstance(exc, openai.APIStatusError):
            return f"it answered HTTP {exc.status_code}: {remote_message(exc)}"
        if isinstance(exc, openai.APITimeoutError):
            return "it did not answer in time"
        if isinstance(exc, openai.APIConnectionError) or is_transport_error(exc):
            return (
                "the connection broke mid-reply" if mid_reply else "cannot connect; is it running?"
            )
        if listing:
            return f"its /v1/models answer is not OpenAI's ({type(exc).__name__}): is this the right address?"
        return f"{type(exc).__name__}: {exc}"

    # ---- one reply

    async def generate(
        self, request: GenerateRequest, stop: asyncio.Event
    ) -> AsyncIterator[UserReply]:
        import openai

        where = f"the remote at {self.shown_url}"
        stream = None
        stopper = asyncio.ensure_future(stop.wait())
        tally = ReplyTally()
        try:
            if self.model_name is None:
                await until_stopped(self.check(), stopper)
            if self.model_name is None:
                if not stop.is_set():
                    yield UserReply(
                        0, "", finished=True, error=f"{where}: {self.error or 'no model'}"
                    )
                return
            stream = await until_stopped(
                self.client.chat.completions.create(**chat_body(request, self.model_name)), stopper
            )
            if stream is None:
                return  # stopped before the remote answered: the request was cancelled with its connection
            async with contextlib.aclosing(self._replies(stream, stopper, tally, where)) as replies:
                async for reply in replies:
                    yield reply
        except Exception as exc:  # noqa: BLE001 (a remote's failure is a sentence in the chat, never a traceback)
            if not isinstance(exc, openai.APIError) and not is_transport_error(exc):
                logger.exception("the reply from %s failed", self.shown_url)
            reason = self.describe(exc, mid_reply=tally.started)
            if isinstance(exc, (openai.APIConnectionError, openai.AuthenticationError)) or (
                is_transport_error(exc)
            ):
                self.error, self.checked_at = (
                    reason,
                    time.monotonic(),
                )  # the status line says so at once
            yield tally.failed(f"{where}: {reason}")
        finally:
            stopper.cancel()
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.close()

    @staticmethod
    async def _replies(
        stream, stopper: asyncio.Future, tally: ReplyTally, where: str
    ) -> AsyncIterator[UserReply]:
        """The replies of an open stream, the last one finished; none more after Stop."""
        chunks = aiter(stream)
        while True:
            try:
                chunk = await until_stopped(anext(chunks), stopper)
            except StopAsyncIteration:
                break
            if (
                chunk is None
            ):  # Stop: closing the stream (in generate) makes the remote abort the request
                if (last := tally.stopped()) is not None:
                    yield last
                return
            text = tally.add(chunk)
            if text:
                yield UserReply(0, text, completion_tokens=tally.tokens)
        if (calls := tally.calls()) is not None:
            yield calls  # the page's tool loop runs them (none come unless it offered tools)
        yield tally.ended(where)

    async def close(self) -> None:
        await self.client.close()
