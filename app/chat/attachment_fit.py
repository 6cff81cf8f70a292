"""Files attached to a message that make it too long for the model: found before the message is
sent, with how many tokens the files are and how many fit, and their first part cut to fit (the
page offers to send that, or to cancel). No Gradio here.

What must fit is the message alone with the chat's system prompt: the oldest turns of a chat can
be left out (context_fit.py), the message cannot. The room kept for the reply is the same as
context_fit's (``reply_room``), so a message cut here is one the chat's policy then sends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minisgl_engine import UserError

from .composing import with_attachments
from .context_fit import WHOLE_COUNT_CHARS, reply_room
from .store import ChatSettings, Conversation
from .view import engine_messages, markdown_literal

# the text of a user message -> the tokens of the prompt it makes (with the system prompt)
CountMessage = Callable[[str], int]
FIRST_PART = " (the first part)"  # after the name of a file cut to fit


@dataclass(frozen=True)
class TooLong:
    """Attachments past the model's context. ``file_tokens``: the tokens the files add to the
    message; ``fitting``: how many of those fit; ``cut``: the files cut to fit (the first part
    of their text, in order; a cut file's name says so)."""

    file_tokens: int
    fitting: int
    context_len: int
    reply_room: int
    cut: list[tuple[str, str]]

    def notice(self, names: list[str]) -> str:
        """What the page says above its choice to send the first part or cancel."""
        files = (
            f"**{markdown_literal(names[0])}** is" if len(names) == 1 else "The files attached are"
        )
        return (
            f"⚠ {files} {self.file_tokens:,} tokens, too long for the model: {self.fitting:,} of "
            f"them fit (its context is {self.context_len:,} tokens: {self.reply_room:,} kept for "
            "the reply, the rest for your message and the system prompt)."
        )


def first_chars(attachments: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    """The first ``n`` characters of the files' text, in order: the files before the cut whole,
    the one it falls in cut (named so), none after it."""
    out: list[tuple[str, str]] = []
    for name, body in attachments:
        if n <= 0:
            break
        out.append((name, body) if len(body) <= n else (name + FIRST_PART, body[:n]))
        n -= len(body)
    return out


def first_part(
    text: str,
    attachments: list[tuple[str, str]],
    count: CountMessage,
    context_len: int,
    room: int,
) -> TooLong | None:
    """None when ``text`` with its files fits in the context less the reply's ``room``, or when
    the typed text does not fit even without them (the files are not why: sending says to
    shorten it). Else how far past they are, and the most of their first characters that fit:
    a binary search over the characters kept, each count of at most WHOLE_COUNT_CHARS
    characters a token of the budget (no tokenizer spells more), after the whole's count."""
    budget = context_len - room
    whole = count(with_attachments(text, attachments))
    if whole <= budget:
        return None
    bare = count(with_attachments(text, []))
    if bare > budget:
        return None
    total = sum(len(body) for _, body in attachments)
    fits, fitting, over = 0, bare, min(total, budget * WHOLE_COUNT_CHARS)  # ``over`` does not fit
    while over - fits > 1:
        mid = (fits + over) // 2
        n = count(with_attachments(text, first_chars(attachments, mid)))
        if n <= budget:
            fits, fitting = mid, n
        else:
            over = mid
    return TooLong(whole - bare, fitting - bare, context_len, room, first_chars(attachments, fits))


def attachments_too_long(
    settings: ChatSettings, source, text: str, attachments: list[tuple[str, str]]
) -> TooLong | None:
    """``first_part`` for a message to a chat of ``settings`` answered by ``source``, counted by
    its tokenizer; None where it cannot count (a remote: the remote then refuses what does not
    fit, and the reply says so)."""
    count_tokens = getattr(source, "count_prompt_tokens", None)
    context = getattr(source, "context_len", None)
    if count_tokens is None or not context or not attachments:
        return None
    system = engine_messages(Conversation(0, "", 0.0, 0.0, settings), settings)
    kwargs = {"enable_thinking": bool(settings.thinking)} if source.supports_thinking else None

    def count(message: str) -> int:
        n = count_tokens([*system, {"role": "user", "content": message}], kwargs)
        if n is None:
            raise UserError("no tokenizer")
        return n

    try:
        return first_part(
            text, attachments, count, context, reply_room(settings.max_tokens, context)
        )
    except UserError:  # no tokenizer, or a template that refuses the message: sent as it is
        return None
