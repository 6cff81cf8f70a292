"""A chat's prompt fitted into the model's context (the chat's context policy), counted in the
model's own tokens: the chat template and tokenizer the engine's tokenizers use, loaded once in
the front end, so a count here is the ``prompt_tokens`` the engine reports (tests/server checks
it). No Gradio here.

Room is left for the reply: ``reply_room`` tokens, the chat's max tokens but at most a quarter of
the context, so a chat with max tokens near the context still keeps three quarters of it for what
the model reads. A prompt fits when prompt tokens + reply room <= context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .store import DROP_OLDEST, STOP_AT_CONTEXT

__all__ = ["DROP_OLDEST", "STOP_AT_CONTEXT", "ContextOverflow", "Fit", "fit_messages", "reply_room"]

REPLY_SHARE = 4  # the reply's room is at most 1/REPLY_SHARE of the context
# a chat of more characters than this per token of the budget is not counted whole first: no
# tokenizer of a served model spells 16 characters a token on average
WHOLE_COUNT_CHARS = 16

# messages (OpenAI-style dicts) -> the prompt's length in tokens
CountTokens = Callable[[list[dict]], int]


class ContextOverflow(Exception):
    """The chat cannot be sent as it is: the message says why and what to do. ``prompt_tokens``:
    the whole chat's count; ``droppable``: whether dropping the oldest turns would make it fit."""

    def __init__(self, message: str, prompt_tokens: int, droppable: bool) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.droppable = droppable


@dataclass(frozen=True)
class Fit:
    """What the model reads of a chat: ``messages`` (the system prompt and the last turns),
    ``dropped`` (how many of the chat's messages, after the system prompt, it leaves out),
    ``prompt_tokens`` (the prompt's length)."""

    messages: list[dict]
    dropped: int
    prompt_tokens: int


def reply_room(max_tokens: int, context_len: int) -> int:
    """The tokens kept free for the reply: the chat's max tokens, at most 1/REPLY_SHARE of the context."""
    return max(1, min(int(max_tokens), context_len // REPLY_SHARE))


def turn_starts(messages: list[dict], first: int) -> list[int]:
    """The indexes where a turn starts (a user message), from ``first`` on: what may be dropped
    is whole turns, a question with its replies, so the model never reads a reply without its
    question."""
    return [i for i in range(first, len(messages)) if messages[i]["role"] == "user"] or [first]


def fit_messages(
    messages: list[dict], count: CountTokens, context_len: int, room: int, policy: str
) -> Fit:
    """``messages`` as the model reads them under ``policy``: all of them if they fit in
    ``context_len - room`` tokens; else (DROP_OLDEST) the system prompt and the last turns, the
    fewest oldest turns dropped. The last turn is always kept: raises ContextOverflow when it
    does not fit alone, or (STOP_AT_CONTEXT) when the chat does not fit whole.

    The counts: the whole chat first, unless it has so many characters that it cannot fit
    (more than WHOLE_COUNT_CHARS per token of the budget); then from the last turn backwards,
    doubling the turns kept until they do not fit, and a binary search between. A chat far past
    the context is never counted whole (a 200-turn chat of 80,000 tokens took 0.7 s to count on
    a busy 2-core machine), and each count is of a prompt at most about twice what fits."""
    budget = context_len - room
    head = 1 if messages and messages[0]["role"] == "system" else 0
    starts = turn_starts(messages, head)
    total = len(starts)

    def kept_from(k: int) -> list[dict]:  # the system prompt and the last k turns (all: the chat)
        return messages if k >= total else messages[:head] + messages[starts[total - k] :]

    fits, fits_count, over, n = 0, 0, None, 0  # k=fits fits (0: nothing yet); k=over does not
    whole = None  # the whole chat's count, once known
    if sum(len(str(m.get("content") or "")) for m in messages) <= budget * WHOLE_COUNT_CHARS:
        n = whole = count(messages)
        if n <= budget:
            return Fit(messages, 0, n)
        over = total
    k = 1
    while k < (over or total + 1):  # double the turns kept until they do not fit
        n = count(kept_from(k))
        if n > budget:
            over = k
            break
        if k >= total:
            return Fit(messages, 0, n)
        fits, fits_count, k = k, n, min(2 * k, total)
    if fits == 0:
        raise ContextOverflow(
            f"your message is too long for the model: it needs {n:,} tokens with the system prompt, "
            f"and the model reads at most {budget:,} ({context_len:,} in all, {room:,} kept for the reply); shorten it",
            n,
            droppable=False,
        )
    if policy == STOP_AT_CONTEXT:
        whole = whole if whole is not None else count(messages)
        raise ContextOverflow(
            f"the chat is {whole:,} tokens, past what the model reads ({budget:,} of its {context_len:,}, "
            f"{room:,} kept for the reply)",
            whole,
            droppable=True,
        )
    while over - fits > 1:  # the most turns that fit lie between
        mid = (fits + over) // 2
        n = count(kept_from(mid))
        if n <= budget:
            fits, fits_count = mid, n
        else:
            over = mid
    kept = kept_from(fits)
    return Fit(kept, len(messages) - len(kept), fits_count)
