"""The front end's client of the engine: one way in for the OpenAI routes and the chat UI.

``generate`` assigns a uid, sends a ``TokenizeMsg`` to tokenizer ``uid % N`` and yields the
``UserReply`` messages that ``listen()`` routes back by uid. Per-uid state lives only while a
request is in flight: it is deleted when the request finishes, fails or is abandoned by its
consumer, and an abandoned request is aborted in the engine.

With ``--dp N`` the front end also picks each request's replica (``router.ReplicaRouter``: the
one holding the longest cached prefix of its prompt, else the least loaded); the replica's index
travels in the request's messages, and each replica's stats arrive tagged with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from ..errors import RequestError, check_prompt_chars, prompt_chars
from ..messages import (
    AbortMsg,
    FrontendBatch,
    PromptProgressMsg,
    ReadyMsg,
    StartupMsg,
    StatsMsg,
    TokenizeMsg,
    TokenizerBatch,
    UserReply,
    decoder,
    encode,
    sum_stats,
)
from ..sampling_params import SamplingParams
from .ipc import SocketPaths, scheduler_name
from .router import ReplicaRouter, prompt_blocks

logger = logging.getLogger("minisgl.frontend")


@dataclass
class GenerateRequest:
    """One request as the front end hands it to the tokenizers: exactly one of ``text``,
    ``messages`` (the tokenizer applies the chat template) or ``input_ids``. The OpenAI routes
    and the chat page both make these."""

    params: SamplingParams
    text: str | None = None
    messages: list[dict] | None = None
    input_ids: list[int] | None = None
    chat_template_kwargs: dict | None = None
    replica: int | None = (
        None  # --dp: run it on this replica (the n choices of a prompt share one); None: routed
    )


async def wait_first(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Return once one of ``events`` is set, or after ``timeout`` seconds (None: no limit)."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class FrontendClient:
    def __init__(
        self,
        paths: SocketPaths,
        model_name: str,
        expected_workers: list[str],
        routing: str = "prefix",
    ) -> None:
        """``expected_workers``: those that report ready, the first scheduler among them being
        replica 0's rank 0 (whose device and settings the page shows)."""
        self.paths = paths
        self.model_name = model_name
        self.expected_workers = set(expected_workers)
        self.leader = next(
            (w for w in expected_workers if w.endswith("-scheduler")), scheduler_name(0, 0)
        )
        self._ready = False
        self.ready_event = (
            asyncio.Event()
        )  # set while ``ready`` (awaited by whoever waits for start-up)
        self.phase = "starting"  # what start-up is doing, for the chat page
        self.switching = False  # the workers restart with another model (engine_host.py); new requests are refused
        self.switch_reason = ""
        self.tokenizer_path: str | None = None  # known once the model is resolved
        self.max_context_len: int | None = None
        self.replica_stats: dict[int, StatsMsg] = {}  # each replica's latest (one without --dp)
        self.stats_arrived = (
            asyncio.Event()
        )  # set as each StatsMsg arrives (wait_for_stats clears it)
        self.routing = routing
        self.router = ReplicaRouter(paths.num_replicas, routing)
        self.worker_info: dict[str, dict] = {}
        self.startup_errors: dict[str, str] = {}
        # set when a worker reports a start-up error: whoever saw that worker exit waits on it
        # for the report, which travels apart from the exit (engine_host.EngineHost.on_exit)
        self.error_reported = threading.Event()
        self.pending: dict[
            int, asyncio.Queue[UserReply | PromptProgressMsg | None]
        ] = {}  # None: the request was stopped
        self._uids = itertools.count(1)
        self._decoder = decoder(FrontendBatch)
        # Sends go through plain sockets: PUSH never blocks here, and an abort must be sendable
        # from a `finally` that cannot await.
        self._send_ctx = zmq.Context()
        self._tokenizers: list[zmq.Socket] = []
        self._connect_tokenizers()
        self._recv_ctx = zmq.asyncio.Context()
        self._receiver = self._recv_ctx.socket(zmq.PULL)
        self._receiver.setsockopt(zmq.LINGER, 0)
        self._receiver.bind(paths.frontend)
        self._listen_task: asyncio.Task | None = None

    def _connect_tokenizers(self) -> None:
        """(Re)connect to the tokenizers: after a model switch, nothing queued for the old
        workers may reach the new ones."""
        for sock in self._tokenizers:
            sock.close()
        self._tokenizers = []
        for i in range(self.paths.num_tokenizers):
            sock = self._send_ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.paths.tokenizer(i))
            self._tokenizers.append(sock)

    @property
    def ready(self) -> bool:
        """Every expected worker reported ready (for the current model)."""
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = value
        (self.ready_event.set if value else self.ready_event.clear)()

    def begin_switch(self, model_name: str, reason: str) -> None:
        """The workers are about to stop for ``model_name``: requests in flight end with
        ``reason`` (when one is given), new ones are refused with it until the new workers are ready."""
        self.switching = True
        self.switch_reason = reason or f"the engine is restarting with {model_name}"
        self.ready = False
        self.phase = "stopping the previous model"
        if reason:
            self.fail_pending(reason)

    def use_model(self, model_name: str, tokenizer_path: str | None, max_context_len: int) -> None:
        """The workers about to start serve ``model_name``: what the last ones reported is
        forgotten, and the tokenizers are connected to afresh."""
        self.model_name = model_name
        self.tokenizer_path = tokenizer_path
        self.max_context_len = max_context_len
        self.ready = False
        self.worker_info = {}
        self.startup_errors = {}
        self.error_reported.clear()
        self.replica_stats = {}
        self.router = ReplicaRouter(self.paths.num_replicas, self.routing)
        self._connect_tokenizers()

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    async def wait_for_stats(self, done: Callable[[StatsMsg], bool], timeout: float) -> bool:
        """Wait until ``done(self.stats)`` holds (checked as each replica's figures arrive: a
        scheduler pushes them when they change); whether it did within ``timeout`` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.stats is None or not done(self.stats):
            self.stats_arrived.clear()
            try:
                await asyncio.wait_for(
                    self.stats_arrived.wait(), deadline - asyncio.get_running_loop().time()
                )
            except asyncio.TimeoutError:
                return self.stats is not None and done(self.stats)
        return True

    @property
    def stats(self) -> StatsMsg | None:
        """The whole engine's load and totals (every replica's added up); None before any."""
        if len(self.replica_stats) <= 1:
            return next(iter(self.replica_stats.values()), None)
        return sum_stats(list(self.replica_stats.values()))

    @property
    def thinks(self) -> str | None:
        """Whether the model writes <think> blocks (chat replies get ``reasoning_content``): None,
        "model" (the reply opens the block) or "template" (the prompt opened it)."""
        return self.worker_info.get("minisgl-tokenizer-0", {}).get("thinks")

    @property
    def tool_format(self) -> str | None:
        """How the model writes tool calls (its chat template's convention), None if it has none."""
        return self.worker_info.get("minisgl-tokenizer-0", {}).get("tool_format")

    @property
    def max_token_chars(self) -> int | None:
        """The most characters a token of the model's vocabulary spells (its tokenizer says)."""
        return self.worker_info.get("minisgl-tokenizer-0", {}).get("max_token_chars")

    def check_prompt_chars(self, req: GenerateRequest) -> None:
        """Refuse at once a prompt of more characters than the context could hold (the
        tokenizer checks it too): nothing of it is hashed, sent or tokenized."""
        if (
            self.max_context_len is not None
            and self.max_token_chars is not None
            and req.input_ids is None
        ):
            check_prompt_chars(
                prompt_chars(req.text, req.messages),
                self.max_context_len,
                self.max_token_chars,
                param="messages" if req.messages is not None else "prompt",
            )

    @property
    def scheduler_info(self) -> dict:
        """Device, dtype, KV size... as replica 0's rank 0 reported them at start."""
        return self.worker_info.get(self.leader, {})

    def start(self) -> None:
        """Start routing replies (call from the server's event loop)."""
        self._listen_task = asyncio.get_running_loop().create_task(self.listen())

    async def listen(self) -> None:
        while True:
            raw = await self._receiver.recv()
            try:
                batch = self._decoder.decode(raw)
            except Exception as exc:
                logger.warning("dropped an invalid message (%d bytes): %s", len(raw), exc)
                continue
            for msg in batch.msgs:
                if isinstance(msg, UserReply | PromptProgressMsg):
                    queue = self.pending.get(msg.uid)
                    if queue is not None:  # else: its consumer is gone (aborted) — drop it
                        queue.put_nowait(msg)
                elif isinstance(msg, StatsMsg):
                    self.replica_stats[msg.replica] = msg
                    self.stats_arrived.set()
                elif isinstance(msg, ReadyMsg):
                    self._on_ready(msg)
                elif isinstance(msg, StartupMsg) and not self.ready:
                    self.phase = msg.phase

    def _on_ready(self, msg: ReadyMsg) -> None:
        if msg.error is not None:
            self.startup_errors[msg.worker] = msg.error
            self.error_reported.set()
            logger.error("%s failed to start: %s", msg.worker, msg.error)
            return
        self.worker_info[msg.worker] = msg.info
        logger.info(
            "%s ready%s",
            msg.worker,
            f" ({', '.join(f'{k}={v}' for k, v in msg.info.items())})" if msg.info else "",
        )
        if self.expected_workers <= set(self.worker_info):
            self.ready = True

    def route(self, req: GenerateRequest) -> int:
        """Choose the replica for ``req`` now (and count its prefixes as held there): requests
        that must share one replica's cache (a prompt's n choices) are sent with ``replica`` set."""
        return self.router.choose(prompt_blocks(req.text, req.messages, req.input_ids))

    def _send(self, uid: int, msg: TokenizeMsg | AbortMsg) -> None:
        self._send_raw(uid, encode(TokenizerBatch([msg])))

    def _send_raw(self, uid: int, data: bytes) -> None:
        self._tokenizers[uid % len(self._tokenizers)].send(data)

    def fail_pending(self, message: str) -> None:
        """End every waiting request with ``message`` (the engine is gone): their streams end
        with an error at once instead of hanging until the HTTP server's shutdown cancels them."""
        for uid, queue in list(self.pending.items()):
            queue.put_nowait(
                UserReply(uid, "", finished=True, finish_reason="error", error=message)
            )

    def _replica_for(self, req: GenerateRequest) -> int:
        """The replica a request goes to: the one it names, or the router's choice."""
        if req.replica is None:
            return self.router.choose(prompt_blocks(req.text, req.messages, req.input_ids))
        if 0 <= req.replica < self.router.num_replicas:
            return req.replica
        raise RequestError(
            f"replica {req.replica} does not exist (this server runs {self.router.num_replicas})"
        )

    async def generate(
        self, req: GenerateRequest, stop: asyncio.Event | None = None, progress: bool = False
    ) -> AsyncIterator[UserReply | PromptProgressMsg]:
        """Yield the request's replies until it finishes. Setting ``stop`` (the chat's Stop
        button) ends the stream at once, even mid-prefill when no reply is due yet, and aborts
        the request in the engine, the same as abandoning the iterator. ``progress``: also yield
        how far a long prompt has been read (``PromptProgressMsg``, before the first reply; the
        chat page shows it), which the OpenAI routes have no place for."""
        self.check_prompt_chars(req)
        uid = next(self._uids)
        if self.switching:  # the workers are restarting: nothing would answer
            yield UserReply(
                uid,
                "",
                finished=True,
                finish_reason="error",
                error=f"{self.switch_reason}; send it again once it is ready",
            )
            return
        replica = self._replica_for(req)
        data = _encoded_tokenize(uid, req, replica)
        queue: asyncio.Queue[UserReply | PromptProgressMsg | None] = asyncio.Queue()
        self.pending[uid] = queue
        finished = replied = False
        stop_watch = (
            asyncio.create_task(_put_none_when_set(stop, queue)) if stop is not None else None
        )
        self.router.started(replica)
        try:
            self._send_raw(uid, data)
            while not finished:
                reply = await queue.get()
                if reply is None:  # stopped
                    return
                if isinstance(reply, PromptProgressMsg):
                    # sent apart from the replies: the last may come after the first reply
                    if progress and not replied:
                        yield reply
                    continue
                finished, replied = reply.finished, True
                yield reply
        finally:
            if stop_watch is not None:
                stop_watch.cancel()
            del self.pending[uid]
            self.router.ended(replica)
            if not finished:
                self._send(uid, AbortMsg(uid, replica))

    def close(self) -> None:
        if self._listen_task is not None:
            self._listen_task.cancel()
        self._receiver.close()
        for sock in self._tokenizers:
            sock.close()
        self._recv_ctx.term()
        self._send_ctx.term()


def _encoded_tokenize(uid: int, req: GenerateRequest, replica: int) -> bytes:
    """The request as the tokenizer's message, encoded; a request no message can hold is refused."""
    msg = TokenizeMsg(
        uid,
        req.params,
        text=req.text,
        messages=req.messages,
        input_ids=req.input_ids,
        chat_template_kwargs=req.chat_template_kwargs,
        replica=replica,
    )
    try:  # JSON may carry lone surrogates ("\ud800") or integers beyond 64 bits: no message holds them
        return encode(TokenizerBatch([msg]))
    except UnicodeEncodeError:
        raise RequestError(
            "the request holds text that is not valid Unicode (a lone surrogate such as \\ud800)"
        ) from None
    except OverflowError:
        raise RequestError(
            "the request holds an integer outside the 64-bit range (seed, top_k or a token id)"
        ) from None


async def _put_none_when_set(event: asyncio.Event, queue: asyncio.Queue) -> None:
    await event.wait()
    queue.put_nowait(None)
