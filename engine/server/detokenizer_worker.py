"""``minisgl-detokenizer-0``: token ids back to text, incrementally and UTF-8-safe (a character
split over several tokens is sent only once complete), with stop strings trimmed."""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import zmq

from ..messages import AbortBackendMsg, BackendBatch, DetokenizerBatch, DetokenizeMsg, FrontendBatch, ReadyMsg, UserReply
from .ipc import Receiver, Sender, SocketPaths
from .process import init_worker

logger = logging.getLogger(__name__)

RECENTLY_STOPPED_KEPT = 4096


@dataclass
class DecodeState:
    """One request's text so far. ``prefix_offset..read_offset`` is a window of tokens already
    turned into text, re-decoded together with the new ones so that tokenizers which merge
    spaces or bytes across tokens produce the same text as decoding everything at once."""

    stop: list[str]
    prompt_tokens: int
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    held: str = ""  # decoded text not sent yet because it may be the start of a stop string

    def push(self, tokenizer, token: int) -> str:
        """Append a token; return the newly complete text (may be empty)."""
        self.ids.append(token)
        if tokenizer is None:
            return ""
        before = tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        after = tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing new, or half of a multi-byte character
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]

    def flush(self, tokenizer) -> str:
        """At the end: whatever is still pending, even an incomplete character."""
        if tokenizer is None or self.read_offset == len(self.ids):
            return ""
        before = tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        after = tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        self.read_offset = len(self.ids)
        return after[len(before) :]

    def apply_stop(self, new_text: str, final: bool) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string was found). Text that could be the
        beginning of a stop string is held back until it is decided."""
        text = self.held + new_text
        if not self.stop:
            self.held = ""
            return text, False
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.held = ""
            return text[:cut], True
        if final:
            self.held = ""
            return text, False
        keep = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
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
            state = self.states[msg.uid] = DecodeState(stop=list(msg.stop or []), prompt_tokens=msg.prompt_tokens)
        new_text = state.push(self.tokenizer, msg.next_token) if msg.next_token is not None else ""
        if msg.finished:
            new_text += state.flush(self.tokenizer)
        text, hit_stop = state.apply_stop(new_text, final=msg.finished)
        finished = msg.finished or hit_stop
        reason = "stop" if hit_stop else msg.finish_reason
        reply = UserReply(
            msg.uid, text, finished=finished, finish_reason=reason if finished else None, error=msg.error,
            prompt_tokens=state.prompt_tokens, completion_tokens=len(state.ids),
        )
        if finished:
            del self.states[msg.uid]
        if hit_stop and not msg.finished:
            self.stopped[msg.uid] = None
            while len(self.stopped) > RECENTLY_STOPPED_KEPT:
                self.stopped.popitem(last=False)
            return reply, True
        return reply, False


@dataclass(frozen=True)
class DetokenizerWorkerArgs:
    paths: SocketPaths
    tokenizer_path: str | None
    parent_pid: int
    log_level: int = logging.WARNING


def run_detokenizer_worker(args: DetokenizerWorkerArgs) -> None:
    name = "minisgl-detokenizer-0"
    init_worker(name, args.parent_pid, args.log_level)
    ctx = zmq.Context()
    to_frontend = Sender(ctx, args.paths.frontend)
    try:
        from ..tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer_path) if args.tokenizer_path else None
        receiver = Receiver(ctx, args.paths.detokenizer, DetokenizerBatch)
    except Exception as exc:
        to_frontend.send(FrontendBatch([ReadyMsg(name, error=f"{type(exc).__name__}: {exc}")]))
        sys.exit(1)
    to_scheduler = Sender(ctx, args.paths.scheduler)
    detokenizer = Detokenizer(tokenizer)
    to_frontend.send(FrontendBatch([ReadyMsg(name)]))
    while True:
        replies: list = []
        drops: list = []
        for batch in receiver.recv_all(block=True):
            for msg in batch.msgs:
                reply, drop = detokenizer.handle(msg)
                if reply is not None:
                    replies.append(reply)
                if drop:
                    drops.append(AbortBackendMsg(msg.uid))
        if replies:
            to_frontend.send(FrontendBatch(replies))
        if drops:
            to_scheduler.send(BackendBatch(drops))
