"""``minisgl-tokenizer-{i}``: turns text or chat messages into token ids (the model's chat
template with its generation prompt), checks the length against the context, and forwards
aborts. Requests of one uid always come to the same tokenizer, so an abort never overtakes its
request."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import zmq

from ..errors import UserError, check_prompt_length
from ..tokenizer import chat_prompt_ids
from ..messages import AbortBackendMsg, AbortMsg, BackendBatch, FrontendBatch, ReadyMsg, TokenizeMsg, TokenizerBatch, UserMsg, UserReply
from .ipc import Receiver, Sender, SocketPaths, reporting_startup, tokenizer_name
from .process import init_worker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizerWorkerArgs:
    index: int
    paths: SocketPaths
    tokenizer_path: str | None
    max_context_len: int
    parent_pid: int
    log_level: int = logging.WARNING


class PromptEncoder:
    def __init__(self, tokenizer, max_context_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len

    def encode(self, msg: TokenizeMsg) -> list[int]:
        given = [x is not None for x in (msg.text, msg.messages, msg.input_ids)]
        if sum(given) != 1:
            raise UserError("give exactly one of a prompt text, chat messages or token ids")
        if msg.input_ids is not None:
            ids = list(msg.input_ids)
        elif self.tokenizer is None:
            raise UserError("this server has no tokenizer (dummy weights): send token ids")
        elif msg.text is not None:
            ids = self.tokenizer.encode(msg.text)
        else:
            ids = chat_prompt_ids(self.tokenizer, msg.messages, msg.chat_template_kwargs)
        check_prompt_length(len(ids), self.max_context_len)
        return ids



def run_tokenizer_worker(args: TokenizerWorkerArgs) -> None:
    name = tokenizer_name(args.index)
    init_worker(name, args.parent_pid, args.log_level)
    ctx = zmq.Context()
    to_frontend = Sender(ctx, args.paths.frontend)
    with reporting_startup(name, to_frontend):
        from ..tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer_path) if args.tokenizer_path else None
        receiver = Receiver(ctx, args.paths.tokenizer(args.index), TokenizerBatch)
    to_schedulers = [Sender(ctx, args.paths.scheduler(i)) for i in range(args.paths.num_replicas)]
    encoder = PromptEncoder(tokenizer, args.max_context_len)
    from .reasoning import thinking_mode
    from .tool_calls import template_tool_format

    # the front end splits <think> blocks and tool calls off chat replies only for a model whose
    # chat template has them
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    info = {"thinks": thinking_mode(tokenizer), "tool_format": template_tool_format(template)}
    to_frontend.send(FrontendBatch([ReadyMsg(name, info=info)]))
    while True:
        forward: list[list] = [[] for _ in to_schedulers]  # per replica (--dp), as the front end chose
        errors: list = []
        for batch in receiver.recv_all(block=True):
            for msg in batch.msgs:
                if not 0 <= msg.replica < len(to_schedulers):
                    logger.warning("dropped a message for replica %d of %d", msg.replica, len(to_schedulers))
                    continue
                if isinstance(msg, AbortMsg):
                    forward[msg.replica].append(AbortBackendMsg(msg.uid))
                    continue
                try:
                    forward[msg.replica].append(UserMsg(msg.uid, encoder.encode(msg), msg.params))
                except UserError as exc:
                    errors.append(UserReply(msg.uid, "", finished=True, finish_reason="error", error=str(exc)))
        for sender, msgs in zip(to_schedulers, forward):
            if msgs:
                sender.send(BackendBatch(msgs))
        if errors:
            to_frontend.send(FrontendBatch(errors))
