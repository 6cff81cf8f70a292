"""``minisgl-detokenizer-0``: token ids back to text, incrementally and UTF-8-safe (a character
split over several tokens is sent only once complete), with stop strings trimmed."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import zmq

from ..detokenize import DecodeState, TokenBytes
from ..messages import (
    AbortBackendMsg,
    BackendBatch,
    DetokenizeMsg,
    DetokenizerBatch,
    FrontendBatch,
    LogprobEntry,
    ReadyMsg,
    UserReply,
)
from ..tokenizer import TextTokenizer
from .ipc import DETOKENIZER_NAME, Receiver, Sender, SocketPaths, reporting_startup
from .process import init_worker

logger = logging.getLogger(__name__)

RECENTLY_STOPPED_KEPT = 4096


class Detokenizer:
    def __init__(self, tokenizer: TextTokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.token_bytes = TokenBytes(tokenizer)
        self.states: dict[int, DecodeState] = {}
        self.stopped: OrderedDict[int, None] = OrderedDict()  # ended here by a stop string

    def handle(self, msg: DetokenizeMsg) -> tuple[UserReply | None, bool]:
        """(reply for the front end, whether the scheduler must drop the request)."""
        if msg.uid in self.stopped:
            if msg.finished:
                self.stopped.pop(msg.uid, None)
            return None, False
        state = self.states.get(msg.uid)
        if state is None:
            state = self.states[msg.uid] = DecodeState(
                stop=list(msg.stop or []), prompt_tokens=msg.prompt_tokens
            )
        new_text = state.push(self.tokenizer, msg.next_token) if msg.next_token is not None else ""
        if msg.finished:
            new_text += state.flush(self.tokenizer)
        text, hit_stop = state.apply_stop(new_text, final=msg.finished)
        finished = msg.finished or hit_stop
        reason = "stop" if hit_stop else msg.finish_reason
        reply = UserReply(
            msg.uid,
            text,
            finished=finished,
            finish_reason=reason if finished else None,
            error=msg.error,
            prompt_tokens=state.prompt_tokens,
            completion_tokens=len(state.ids),
            logprobs=self._logprobs(msg),
            prompt_logprobs=None
            if msg.prompt_logprobs is None
            else [self._entry(*entry) for entry in msg.prompt_logprobs],
        )
        if finished:
            del self.states[msg.uid]
        if hit_stop and not msg.finished:
            self.stopped[msg.uid] = None
            while len(self.stopped) > RECENTLY_STOPPED_KEPT:
                self.stopped.popitem(last=False)
            return reply, True
        return reply, False

    def _logprobs(self, msg: DetokenizeMsg) -> list[LogprobEntry] | None:
        if msg.logprob is None or msg.next_token is None:
            return None
        return [self._entry(msg.next_token, msg.logprob, msg.top_logprobs or [])]

    def _entry(
        self, token: int, logprob: float | None, top: list[tuple[int, float]]
    ) -> LogprobEntry:
        alternatives = [LogprobEntry(*self.token_bytes.get(t), lp) for t, lp in top]
        return LogprobEntry(*self.token_bytes.get(token), logprob, alternatives)


@dataclass(frozen=True)
class DetokenizerWorkerArgs:
    paths: SocketPaths
    tokenizer_path: str | None
    parent_pid: int
    log_level: int = logging.WARNING


def run_detokenizer_worker(args: DetokenizerWorkerArgs) -> None:
    name = DETOKENIZER_NAME
    init_worker(name, args.parent_pid, args.log_level)
    ctx = zmq.Context()
    to_frontend = Sender(ctx, args.paths.frontend)
    with reporting_startup(name, to_frontend):
        from ..tokenizer import load_text_tokenizer

        tokenizer = load_text_tokenizer(args.tokenizer_path) if args.tokenizer_path else None
        receiver = Receiver(ctx, args.paths.detokenizer, DetokenizerBatch)
    to_schedulers = [Sender(ctx, args.paths.scheduler(i)) for i in range(args.paths.num_replicas)]
    detokenizer = Detokenizer(tokenizer)
    to_frontend.send(FrontendBatch([ReadyMsg(name)]))
    while True:
        replies: list = []
        drops: list[list] = [[] for _ in to_schedulers]  # requests a stop string ended, per replica
        for batch in receiver.recv_all(block=True):
            for msg in batch.msgs:
                reply, drop = detokenizer.handle(msg)
                if reply is not None:
                    replies.append(reply)
                if drop and 0 <= msg.replica < len(to_schedulers):
                    drops[msg.replica].append(AbortBackendMsg(msg.uid, stop=True))
        if replies:
            to_frontend.send(FrontendBatch(replies))
        for sender, msgs in zip(to_schedulers, drops):
            if msgs:
                sender.send(BackendBatch(msgs))
