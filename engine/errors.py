"""Errors a user can fix themselves.

Anything raised as a :class:`UserError` is reported by the CLI as one line on stderr with exit
code 2 (and by the server as an HTTP 400); everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ModelSourceError(UserError):
    """The model could not be found, downloaded or converted."""


class WeightsError(UserError):
    """The weight files exist but cannot be used (corrupt, missing tensors, too large)."""


class RequestError(UserError):
    """A request the engine must refuse (prompt longer than the context, bad parameters);
    ``param``: the request field at fault, when one is (OpenAI's error ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check_prompt_length(num_tokens: int, max_context_len: int) -> None:
    """The one rule for a prompt's length, applied by the tokenizers (to refuse early) and by the
    scheduler (for token ids sent to it directly): RequestError unless it is served."""
    if num_tokens == 0:
        raise RequestError("the prompt is empty")
    if num_tokens >= max_context_len:
        raise RequestError(
            f"the prompt is {num_tokens} tokens long but the model's context is {max_context_len} tokens; "
            "shorten it (or start a new conversation)"
        )


def prompt_chars(text: str | None, messages: list[dict] | None) -> int:
    """Characters of a prompt's text, or of its chat messages' contents (the template adds more)."""
    if text is not None:
        return len(text)
    return sum(len(m["content"]) for m in messages or () if isinstance(m.get("content"), str))


def check_prompt_chars(
    chars: int, max_context_len: int, max_token_chars: int, param: str | None = None
) -> None:
    """Refuse, before tokenizing it, a prompt of more characters than the context could ever
    hold: no token of the vocabulary spells more than ``max_token_chars`` (a byte-level BPE
    token's string has a character per byte, a character at least a byte). Tokenizing a 10 MB
    message took the tokenizer 39 s, during which everyone else waited."""
    if chars > max_context_len * max_token_chars:
        raise RequestError(
            f"the prompt has {chars:,} characters, more than the model's context of {max_context_len} tokens can "
            f"hold (a token of this model spells at most {max_token_chars} characters); shorten it",
            param=param,
        )
