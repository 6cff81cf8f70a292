"""What a chat's next reply asks the engine, read from the chat as stored when the reply starts
(after any reply before it in the chat): the messages it answers, and the request made from the
chat's own settings. The page's turns (app/page/turns.py) store the reply and start it."""

from __future__ import annotations

from dataclasses import replace

from minisgl_engine import GenerateRequest, SamplingParams

from .reply_protocol import ReplySource
from .store import ChatSettings, Conversation, Message
from .view import engine_messages


def answered_path(
    conv: Conversation, after: int | None = None, continue_id: int | None = None
) -> list[Message] | None:
    """The messages of the chat's shown path that the reply answers: all of them, or those up to
    ``after`` (a question: a new version of its reply) or ``continue_id`` (a reply that goes on).
    None when there is nothing to answer: that message is gone or no longer shown, or the path no
    longer ends in a question (a reply to go on with) — stopped, deleted or answered meanwhile."""
    path = conv.messages
    ids = [m.id for m in path]
    cut = after if after is not None else continue_id
    if cut is not None:
        if cut not in ids:
            return None
        path = path[: ids.index(cut) + 1]
    if not path or path[-1].role != ("assistant" if continue_id is not None else "user"):
        return None
    return path


def sampling_params(s: ChatSettings) -> SamplingParams:
    """The chat's settings as the engine samples by them (top-k 0: off)."""
    return SamplingParams(
        max_tokens=int(s.max_tokens),
        temperature=float(s.temperature),
        top_p=float(s.top_p),
        top_k=int(s.top_k) or -1,
        seed=s.seed,
        stop=list(s.stop),
        repetition_penalty=float(s.repetition_penalty),
    )


def reply_request(
    conv: Conversation, path: list[Message], source: ReplySource, continuing: bool
) -> GenerateRequest:
    """The request for a reply to ``path`` (``answered_path``), with the system prompt in front;
    ``continuing``: the last message is a reply that the model extends."""
    s = conv.settings
    kwargs = {"enable_thinking": bool(s.thinking)} if source.supports_thinking else {}
    if continuing:
        kwargs["continue_final_message"] = True
    return GenerateRequest(
        params=sampling_params(s),
        messages=engine_messages(replace(conv, messages=path), s),
        chat_template_kwargs=kwargs or None,
    )
