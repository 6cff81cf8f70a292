"""Replies in flight, apart from any page: each streams into its own conversation.

A reply is an asyncio task that reads the engine's stream and writes into the conversation's
:class:`LiveReply` (what a page shows while it grows) and into the store (every
``STORE_EVERY_S`` and at the end). Pages never receive a stream; they *watch*: every change bumps
``ReplyManager.version`` and wakes the watchers, which render the conversation their tab has
selected. So switching chats mid-reply cannot mix them, a reply keeps going while another chat is
shown, and a reloaded tab finds its reply still live.

A reply belongs to the browser session that started it. When a session's page goes away
(tab closed) its replies get ``ORPHAN_GRACE_S`` for a page to show them again (a reload);
otherwise they are stopped, so a closed tab stops using the engine. A page that said it went (its
beacon: ``page_gone(for_good=True)``) is gone for good: an event it sent just before, answered
after, neither keeps its replies going nor starts one that outlasts the grace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from minisgl_engine import GenerateRequest, PromptProgressMsg, UserReply

from .context_fit import ContextOverflow
from .store import ConversationStore, MessageStats, NotFoundError, ToolCallRecord
from .tool_loop import ToolLoop, ToolStep

logger = logging.getLogger("minisgl.app")

STORE_EVERY_S = 0.5  # how often a growing reply is written to the database
ORPHAN_GRACE_S = 2.0  # how long a reply outlives the last page that showed it
# How long a session whose page said it went is remembered (ReplyManager.gone): the events it sent
# just before come within seconds, and a reply it queued starts at the latest when the one before
# it ends.
GONE_KEPT_S = 600.0
TAB_CLOSED = "the tab closed"  # how a reply stopped because its page went away says so
APP_STOPPED = "the app stopped"  # ... and one the app's own stop (SIGTERM, Ctrl+C) cut short
NOTHING_TO_ADD = (
    "The model had nothing to add: the reply was already complete."  # a Continue that ended at once
)

# generate(request, stop) -> replies, and a long prompt's progress before them: the engine's
# client (FrontendClient.generate)
Generate = Callable[[GenerateRequest, asyncio.Event], AsyncIterator[UserReply | PromptProgressMsg]]


# The weight of the latest chunk's pace in the pace the time left is reckoned at, and of the time
# left that pace gives in the time left shown (against the one counted down since the chunk
# before). The chunks of a long prompt slow down as it grows (each reads all the tokens before
# it) and a busy machine makes one chunk slower than the next: the average pace since the first
# chunk followed neither, and the latest chunk's pace alone moved the time left up and down by
# seconds at each chunk.
PACE_SMOOTHING = 0.4
LEFT_SMOOTHING = 0.5


@dataclass(frozen=True)
class PromptReading:
    """How far the engine has read a long prompt (``PromptProgressMsg``, one per prefill chunk,
    as it starts), and when: the line under the reply says it until the first word, with the time
    left (``seconds_left``), counted down between two chunks."""

    done: int
    total: int
    at: float  # time.perf_counter() of the latest report
    # how far in reading cost (PromptProgressMsg.work_done, work_total): the pace and time left
    # go by it, as a later chunk takes longer (the time left read ~40% low in tokens)
    work_done: float = 0.0
    work_total: float = 0.0
    pace: float | None = None  # work read per second, smoothed; None before it is known
    left: float | None = None  # the time left, as of ``at``
    timed: int = 0  # the chunks timed so far

    @classmethod
    def after(cls, before: PromptReading | None, msg: PromptProgressMsg, now: float):
        work_done, work_total = (
            (msg.work_done, msg.work_total) if msg.work_total > 0 else (msg.done, msg.total)
        )
        if before is None:
            return cls(msg.done, msg.total, now, work_done, work_total)
        read, took = work_done - before.work_done, now - before.at
        if read <= 0 or took <= 0:
            return replace(
                before, done=msg.done, total=msg.total, work_done=work_done, work_total=work_total
            )
        if before.timed == 0:  # the first chunk is small (the progress shows at once after
            # Send) and its time holds the request's start: its pace said ~40 s left, the next ~25
            return cls(msg.done, msg.total, now, work_done, work_total, timed=1)
        pace = read / took
        if before.pace is not None:
            pace = before.pace + PACE_SMOOTHING * (pace - before.pace)
        left = (work_total - work_done) / pace
        if before.left is not None:
            counted = before.left - took
            left = counted + LEFT_SMOOTHING * (left - counted)
        return cls(msg.done, msg.total, now, work_done, work_total, pace, left, before.timed + 1)

    def seconds_left(self, now: float | None = None) -> float | None:
        """At ``now`` (default: now): the time left, less the time since the latest chunk, and
        at least a second while tokens are left; None before a chunk after the first is timed."""
        if self.left is None:
            return None
        return max(1.0, self.left - ((time.perf_counter() if now is None else now) - self.at))


@dataclass
class LiveReply:
    """One reply being written: its text so far and the figures shown under it."""

    conv_id: int
    message_id: int
    session: str | None
    text: str = ""
    tokens: int = 0  # generated by this run
    earlier: MessageStats | None = None  # a continued reply: its figures before this run
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stopped_by: str | None = (
        None  # why it was stopped, when not by its own Stop (a model switch, its tab closed)
    )
    backend: str | None = (
        None  # where it comes from, when the app has several (ReplySource.backends)
    )
    model_of: Callable[[], str | None] | None = None  # the backend's model now (Turn.model_of)
    model: str | None = None  # the model that answered, read at its first output (None: as stored)
    reading: PromptReading | None = None  # a long prompt being read, before the first word
    read_from: int | None = None  # the first message the model read (Turn.read_from)
    tool_loop: ToolLoop | None = None  # its tool rounds (Turn.tool_loop)
    tool_calls: tuple[ToolCallRecord, ...] = ()  # the tools it called so far
    done: bool = False

    @property
    def earlier_tokens(self) -> int:
        return (self.earlier.tokens or 0) if self.earlier is not None else 0

    @property
    def added_nothing(self) -> bool:
        """A continued reply whose run ended on its own before any new text (EOS first)."""
        return (
            self.earlier is not None
            and self.first_token is None
            and self.finish_reason is not None
            and self.error is None
        )

    def stats(self) -> dict:
        """The stats the store keeps for the reply (MessageStats' fields). A continued run with no
        text of its own keeps the reply's earlier figures: it has none to replace them with."""
        now = time.perf_counter()
        ttft = (self.first_token - self.started) * 1000 if self.first_token else None
        rate = (
            (self.tokens - 1) / (now - self.first_token)
            if self.first_token and self.tokens > 1 and now > self.first_token
            else None
        )
        if self.first_token is None and self.earlier is not None:
            ttft, rate = self.earlier.ttft_ms, self.earlier.tok_s
        if self.tool_calls:  # the time spent on tools (and waiting for the user) is no rate
            rate = None
        stopped = self.finish_reason is None and self.error is None
        return {
            "ttft_ms": ttft,
            "tok_s": rate,
            "tokens": self.earlier_tokens + self.tokens,
            "finish_reason": self.finish_reason,
            "stopped": stopped,
            "stopped_by": self.stopped_by if stopped else None,
            "read_from": self.read_from,
        }


@dataclass
class Turn:
    """What to answer next in a conversation: the request and the stored (empty) reply."""

    request: GenerateRequest
    message_id: int
    text: str = ""  # Continue: the reply's text so far, which the new tokens extend
    earlier: MessageStats | None = (
        None  # Continue: the reply's figures so far (kept if nothing is added)
    )
    backend: str | None = None  # the chat's backend, when the app has several
    generate: Generate | None = None  # that backend's; None: the manager's own
    # the backend's model name, read once the reply's first output comes: a remote whose
    # models were not listed yet knows it only then (the reply was stored without one)
    model_of: Callable[[], str | None] | None = None
    # the first stored message the model reads, when the oldest turns were dropped to fit its
    # context (context_fit); None: it reads the whole chat
    read_from: int | None = None
    # the chat offers tools: the reply runs through this loop (tool_loop.py), which asks the
    # user before each call
    tool_loop: ToolLoop | None = None


class ReplyManager:
    """Every reply in flight, at most one per conversation; later turns wait in line."""

    def __init__(self, store: ConversationStore, generate: Generate) -> None:
        self.store = store
        self.generate = generate
        self.live: dict[int, LiveReply] = {}  # conv_id -> the reply streaming now
        self.queued: dict[
            int, list[tuple[str | None, Callable[[], Turn | None]]]
        ] = {}  # conv_id -> turns to answer after it
        self.tasks: set[asyncio.Task] = set()
        self.watched: dict[str, float] = {}  # session -> when its page was last seen watching
        self.gone: dict[str, float] = {}  # session -> when its page said it went (page_gone)
        self.notices: dict[
            str, list[str]
        ] = {}  # session -> what its page is to say (a toast), once
        self.version = 0
        self.closing = False  # the app is stopping: no turn waiting in line starts
        self._changed = asyncio.Event()

    # ---- what pages read

    def is_busy(self, conv_id: int | None) -> bool:
        return conv_id is not None and (conv_id in self.live or bool(self.queued.get(conv_id)))

    def answers_later(self, conv_id: int | None) -> bool:
        """Whether a message sent now is answered together with the questions waiting before it:
        a reply streams and was not stopped, or turns wait in line. A reply being stopped (Stop
        was pressed, its task has not ended yet) answers nothing more: the message is answered
        on its own."""
        reply = self.live.get(conv_id) if conv_id is not None else None
        return (reply is not None and not reply.stop.is_set()) or bool(self.queued.get(conv_id))

    def busy_conversations(self) -> set[int]:
        return set(self.live) | {c for c, q in self.queued.items() if q}

    def take_notices(self, session: str | None) -> list[str]:
        """What the session's page has yet to say about its replies (each said once)."""
        return self.notices.pop(session, []) if session is not None else []

    async def changes(self, since: int, timeout: float) -> int:
        """Wait until something changed after version ``since`` (or ``timeout``); the version now."""
        if self.version == since:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return self.version

    def notify(self) -> None:
        """Something a page shows changed: wake every watcher."""
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- starting and stopping

    def submit(
        self, conv_id: int, session: str | None, make_turn: Callable[[], Turn | None]
    ) -> None:
        """Answer the conversation now, or after the reply streaming in it (a message sent while
        it replies waits its turn; it is stored and shown at once). ``make_turn`` is called when
        the turn starts, so the request holds everything stored by then."""
        if conv_id in self.live:
            self.queued.setdefault(conv_id, []).append((session, make_turn))
            self.notify()
            return
        self._start(conv_id, session, make_turn)

    def _start(
        self, conv_id: int, session: str | None, make_turn: Callable[[], Turn | None]
    ) -> None:
        try:
            turn = make_turn()
        except NotFoundError:  # the conversation was deleted meanwhile
            turn = None
        except ContextOverflow as exc:  # nothing is sent: the page says why (the chat marks it)
            if session is not None:
                self.notices.setdefault(session, []).append(f"Not sent: {exc}.")
            turn = None
        if turn is None:
            self._next(conv_id)
            return
        reply = LiveReply(
            conv_id,
            turn.message_id,
            session,
            text=turn.text,
            earlier=turn.earlier,
            backend=turn.backend,
            model_of=turn.model_of,
            read_from=turn.read_from,
            tool_loop=turn.tool_loop,
        )
        self.live[conv_id] = reply
        loop = asyncio.get_running_loop()
        task = loop.create_task(
            self._run(reply, turn.request, turn.generate or self.generate), name=f"reply-{conv_id}"
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if session in self.gone:  # sent as its page went (a Send just before the tab closed)
            loop.call_later(ORPHAN_GRACE_S, self._stop_orphans, session)
        self.notify()

    def _next(self, conv_id: int) -> None:
        line = self.queued.get(conv_id)
        if line and not self.closing:
            session, make_turn = line.pop(0)
            if not line:
                del self.queued[conv_id]
            self._start(conv_id, session, make_turn)
        else:
            self.queued.pop(conv_id, None)
            self.notify()

    def decide(self, conv_id: int | None, call_id: str, decision: str) -> bool:
        """The user's decision on a tool call that the chat's reply waits on (tool_loop.DECISIONS);
        False when no such call waits (answered in another tab, or the reply ended)."""
        reply = self.live.get(conv_id) if conv_id is not None else None
        if reply is None or reply.tool_loop is None:
            return False
        return reply.tool_loop.decide(call_id, decision)

    def stop(self, conv_id: int | None) -> bool:
        """Stop the conversation (its user pressed Stop): the reply ends (the engine aborts it and
        frees its KV) and the turns waiting after it are dropped; a question that waited stays in
        the chat, unanswered (view.UNANSWERED_LINE: ↻ answers it)."""
        reply = self.live.get(conv_id) if conv_id is not None else None
        if reply is None:
            return False
        self.queued.pop(conv_id, None)
        reply.stop.set()
        return True

    def stop_every(self, reason: str, backend: str | None = None) -> int:
        """Stop every reply in flight (of ``backend`` only, when given), marked with ``reason``
        (its model is being switched); messages waiting in line are answered next. Returns how
        many were stopped."""
        stopped = [
            reply for reply in self.live.values() if backend is None or reply.backend == backend
        ]
        for reply in stopped:
            reply.stopped_by = reason
            reply.stop.set()
        self.notify()
        return len(stopped)

    def stop_for_exit(self) -> None:
        """The app is stopping: every reply in flight ends as stopped, its text kept as a stopped
        reply's (Continue goes on from it after a restart), not as an error; the questions
        waiting stay in their chats, unanswered (↻ answers them)."""
        self.closing = True
        self.queued.clear()
        self.stop_every(APP_STOPPED)

    def stop_all(self, conv_id: int) -> None:
        """Stop the reply and drop the waiting turns (the conversation is being deleted; a turn
        may wait while no reply runs, between one reply's end and the next's start)."""
        self.queued.pop(conv_id, None)
        self.stop(conv_id)

    # ---- pages coming and going

    def page_seen(self, session: str | None, conv_id: int | None) -> None:
        """A page of ``session`` shows ``conv_id``: the reply there is that session's now (a
        reloaded tab adopts the reply its previous page started). Not a page that said it went
        (``gone``): its last tick, sent just before its beacon and answered after it, had it
        watching again, and its replies went on until its silence was noticed minutes later."""
        if session is None or session in self.gone:
            return
        self.watched[session] = time.monotonic()
        reply = self.live.get(conv_id) if conv_id is not None else None
        if reply is not None:
            reply.session = session

    def page_gone(self, session: str | None, for_good: bool = False) -> None:
        """The session's page closed: stop its replies unless a page shows them again soon.
        ``for_good``: the page said so (its beacon), and a reload is another session: its events
        still on their way no longer count as its page seen (``gone``), and a reply one of them
        starts stops after the same grace."""
        if session is None:
            return
        if for_good:
            now = time.monotonic()
            self.gone = {s: at for s, at in self.gone.items() if now - at < GONE_KEPT_S}
            self.gone[session] = now
        self.watched.pop(session, None)
        asyncio.get_running_loop().call_later(ORPHAN_GRACE_S, self._stop_orphans, session)

    def _stop_orphans(self, session: str) -> None:
        if session in self.watched:
            return
        for conv_id, reply in list(self.live.items()):
            if reply.session == session:
                self.queued.pop(conv_id, None)
                reply.stopped_by = TAB_CLOSED
                reply.stop.set()

    # ---- one reply

    async def _run(self, reply: LiveReply, request: GenerateRequest, generate: Generate) -> None:
        last_store = time.perf_counter()
        if reply.tool_loop is not None:
            stream = reply.tool_loop.generate(request, reply.stop, generate)
        else:
            stream = generate(request, reply.stop)
        try:
            async for out in stream:
                if isinstance(out, ToolStep):  # a call made, decided or answered: shown and kept
                    reply.first_token = reply.first_token or time.perf_counter()
                    reply.tool_calls = out.calls
                    self._store(reply)
                    self.notify()
                    continue
                if isinstance(out, PromptProgressMsg):
                    reply.reading = PromptReading.after(reply.reading, out, time.perf_counter())
                    self.notify()
                    continue
                if reply.model is None and reply.model_of is not None:
                    reply.model = reply.model_of()
                if (
                    out.incremental_output
                ):  # an error reply may still close what came before (a <think> block)
                    reply.first_token = reply.first_token or time.perf_counter()
                    reply.text += out.incremental_output
                if out.error:
                    if reply.stopped_by is None:  # else stopped, and the error says only that
                        reply.error = out.error
                    break
                reply.tokens = out.completion_tokens
                if out.finished:
                    reply.finish_reason = out.finish_reason
                now = time.perf_counter()
                if now - last_store > STORE_EVERY_S:
                    self._store(reply)
                    last_store = now
                self.notify()
        except Exception as exc:  # the engine went away mid-reply: say so in the chat, keep serving
            logger.error("reply in conversation %d failed: %s", reply.conv_id, type(exc).__name__)
            reply.error = f"the reply failed: {exc}"
        finally:
            reply.done = True
            self._store(reply)
            if (
                reply.added_nothing and reply.session is not None
            ):  # the reply looks unchanged: say why
                self.notices.setdefault(reply.session, []).append(NOTHING_TO_ADD)
            if self.live.get(reply.conv_id) is reply:
                del self.live[reply.conv_id]
            self._next(reply.conv_id)

    def _store(self, reply: LiveReply) -> None:
        """What the page shows is what is stored; a refused turn keeps its reason as the reply,
        and a reply that failed half-way (the engine or the remote went away) its text and then
        the reason."""
        stats = reply.stats()
        text = reply.text
        if reply.error is not None:
            stats = {**stats, "finish_reason": "error", "stopped": False}
            text = f"{reply.text}\n\n⚠️ {reply.error}" if reply.text else f"⚠️ {reply.error}"
        try:
            self.store.update_message(
                reply.message_id,
                text,
                stats,
                model=reply.model,
                tool_calls=reply.tool_calls or None,
            )
        except NotFoundError:
            reply.stop.set()  # deleted while it streamed: nothing left to write to
