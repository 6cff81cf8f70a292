"""``minisgl-tokenizer-{i}``: turns text or chat messages into token ids (the model's chat
template with its generation prompt), checks the length against the context, and forwards
aborts. Requests of one uid always come to the same tokenizer, so an abort never overtakes its
request; a request whose abort is already here when its turn comes is dropped untokenized."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from ..errors import UserError, check_prompt_chars, check_prompt_length, prompt_chars
from ..messages import (
    AbortBackendMsg,
    AbortMsg,
    BackendBatch,
    FrontendBatch,
    ReadyMsg,
    TokenizeMsg,
    TokenizerBatch,
    UserMsg,
    UserReply,
)
from ..tokenizer import TextTokenizer, chat_prompt_ids
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


def max_token_chars(tokenizer: TextTokenizer) -> int:
    """The most characters one token of ``tokenizer``'s vocabulary spells."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


class PromptEncoder:
    def __init__(self, tokenizer: TextTokenizer | None, max_context_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len
        self.max_token_chars = max_token_chars(tokenizer) if tokenizer is not None else 1

    def encode(self, msg: TokenizeMsg) -> list[int]:
        given = [x is not None for x in (msg.text, msg.messages, msg.input_ids)]
        if sum(given) != 1:
            raise UserError("give exactly one of a prompt text, chat messages or token ids")
        if msg.input_ids is not None:
            ids = list(msg.input_ids)
        elif self.tokenizer is None:
            raise UserError("this server has no tokenizer (dummy weights): send token ids")
        else:
            check_prompt_chars(
                prompt_chars(msg.text, msg.messages), self.max_context_len, self.max_token_chars
            )
            if msg.text is not None:
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
        from ..tokenizer import load_text_tokenizer

        tokenizer = load_text_tokenizer(args.tokenizer_path) if args.tokenizer_path else None
        receiver = Receiver(ctx, args.paths.tokenizer(args.index), TokenizerBatch)
    to_schedulers = [Sender(ctx, args.paths.scheduler(i)) for i in range(args.paths.num_replicas)]
    encoder = PromptEncoder(tokenizer, args.max_context_len)
    from ..reasoning import thinking_mode
    from ..tool_calls import template_tool_format

    # the front end splits <think> blocks and tool calls off chat replies only for a model whose
    # chat template has them
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    # the front end refuses early a prompt of more characters than the context could hold
    info = {
        "thinks": thinking_mode(tokenizer),
        "tool_format": template_tool_format(template),
        "max_token_chars": encoder.max_token_chars,
    }
    to_frontend.send(FrontendBatch([ReadyMsg(name, info=info)]))

    def arrived() -> list:
        return [msg for batch in receiver.recv_all(block=False) for msg in batch.msgs]

    carried: list = []
    while True:
        pending = carried + [
            msg for batch in receiver.recv_all(block=not carried) for msg in batch.msgs
        ]
        forward, errors, carried = work_through(pending, encoder, len(to_schedulers), arrived)
        for sender, msgs in zip(to_schedulers, forward):
            if msgs:
                sender.send(BackendBatch(msgs))
        if errors:
            to_frontend.send(FrontendBatch(errors))


def work_through(
    pending: list, encoder: PromptEncoder, num_replicas: int, arrived: Callable[[], list] = list
) -> tuple[list[list], list[UserReply], list]:
    """One turn of the tokenizer over the messages ``pending``, in order: (what goes to each
    replica's scheduler, the refusals for the front end, the messages that ``arrived()`` while it
    worked, for the next turn). A request whose abort is among the pending messages, or arrives
    before its turn, is dropped untokenized (its client has left), and so is that abort."""
    forward: list[list] = [
        [] for _ in range(num_replicas)
    ]  # per replica (--dp), as the front end chose
    errors: list[UserReply] = []
    queue, later = deque(pending), []
    aborted = {msg.uid for msg in pending if isinstance(msg, AbortMsg)}
    dropped: set[int] = set()
    while queue:
        msg = queue.popleft()
        if not 0 <= msg.replica < num_replicas:
            logger.warning("dropped a message for replica %d of %d", msg.replica, num_replicas)
            continue
        if isinstance(msg, AbortMsg):
            if msg.uid not in dropped:
                forward[msg.replica].append(AbortBackendMsg(msg.uid))
            continue
        if msg.uid in aborted:
            dropped.add(msg.uid)
            continue
        try:
            forward[msg.replica].append(UserMsg(msg.uid, encoder.encode(msg), msg.params))
        except UserError as exc:
            errors.append(
                UserReply(msg.uid, "", finished=True, finish_reason="error", error=str(exc))
            )
        news = (
            arrived()
        )  # aborts that came while this one was tokenized spare the requests queued behind it
        aborted |= {m.uid for m in news if isinstance(m, AbortMsg)}
        later += news
    return forward, errors, [m for m in later if not (isinstance(m, AbortMsg) and m.uid in dropped)]
