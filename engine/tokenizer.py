"""Loading a model's tokenizer (transformers' fast tokenizers and chat templates), kept apart
from the engine so that tokenizer processes start without loading the model code."""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def chat_prompt_ids(tokenizer, messages: list[dict], kwargs: dict | None = None) -> list[int]:
    """The token ids of ``messages`` in the model's chat template, with its generation prompt (the
    one way a chat becomes a prompt, for the server and the offline ``LLM``). A model without a
    template, or messages its template refuses, raise RequestError with the reason."""
    from .errors import RequestError

    kwargs = kwargs or {}
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("this model has no chat template; use /v1/completions with a plain prompt")
    # continue_final_message: the last (assistant) message is left open so the model goes on
    # writing it (the chat's Continue), instead of starting a new turn
    add_generation_prompt = not kwargs.get("continue_final_message", False)
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, **kwargs)
    except Exception as exc:  # jinja2's TemplateError and friends: the messages don't fit the template
        raise RequestError(f"the chat template rejected these messages: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    return list(out)


def load_tokenizer(path):
    """The folder's tokenizer, or None when it ships none (e.g. a weights-only test model)."""
    from transformers import AutoTokenizer

    if not any((Path(path) / name).exists() for name in TOKENIZER_FILES):
        return None
    return AutoTokenizer.from_pretrained(path)
