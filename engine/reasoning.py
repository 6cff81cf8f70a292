"""Reasoning content: the thinking a model writes between ``<think>`` and ``</think>`` before its
answer (Qwen3 and its kind), returned apart from the answer as ``reasoning_content``, the field
SGLang and vLLM add to OpenAI's chat messages and that Open WebUI reads.

Two kinds of templates: Qwen3's leaves the ``<think>`` tag to the model, so only a reply that
starts with it has reasoning (with ``enable_thinking: false`` the template closes the block in
the prompt and the reply is all answer); thinking-only models' templates (Qwen3-*-Thinking-2507)
open the block in the prompt, so the reply is reasoning up to its ``</think>``. The split works on
streamed text: a tag cut between two chunks is held back until the next chunk says what it is.
"""

from __future__ import annotations

THINK_START = "<think>"
THINK_END = "</think>"


def template_thinks(chat_template: object) -> bool:
    """Whether a model's chat template (a string, or a dict of named ones) speaks of think
    blocks: only then is a reply split."""
    text = chat_template if isinstance(chat_template, str) else str(chat_template or "")
    return THINK_START in text and THINK_END in text


def thinking_mode(tokenizer) -> str | None:
    """How a tokenizer's model thinks: None (no think blocks), "model" (the reply opens the
    block) or "template" (the generation prompt already opened it)."""
    if tokenizer is None or not template_thinks(getattr(tokenizer, "chat_template", None)):
        return None
    try:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that needs more than one user message: the common case
        return "model"
    return "template" if str(prompt).rstrip().endswith(THINK_START) else "model"


class ReasoningSplitter:
    """Feeds on a reply's text as it streams; hands out (reasoning, answer) text."""

    def __init__(self, opened: bool = False) -> None:
        """``opened``: the prompt opened the think block (``thinking_mode`` "template")."""
        # opening (is there a <think>?) -> thinking -> after (whitespace) -> answer
        self.state = "thinking" if opened else "opening"
        self.pending = ""  # text held back: a tag may be cut in two

    def push(self, text: str) -> tuple[str, str]:
        self.pending += text
        reasoning, answer = "", ""
        while True:
            if self.state == "opening":
                head = self.pending.lstrip()
                if head.startswith(THINK_START):
                    self.pending, self.state = head[len(THINK_START) :], "thinking"
                    continue
                if THINK_START.startswith(head):  # nothing yet, or a piece of the tag
                    return reasoning, answer
                self.state = "answer"
                continue
            if self.state == "thinking":
                end = self.pending.find(THINK_END)
                if end >= 0:
                    reasoning += self.pending[:end]
                    self.pending, self.state = self.pending[end + len(THINK_END) :], "after"
                    continue
                keep = partial_tag_at_end(self.pending, THINK_END)
                reasoning += self.pending[: len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep :]
                return reasoning, answer
            if self.state == "after":  # the blank lines between </think> and the answer
                self.pending = self.pending.lstrip()
                if not self.pending:
                    return reasoning, answer
                self.state = "answer"
            answer += self.pending
            self.pending = ""
            return reasoning, answer

    def flush(self) -> tuple[str, str]:
        """The reply ended: what was held back goes where it was heading."""
        rest, self.pending = self.pending, ""
        if self.state == "thinking":  # cut off mid-thought (max_tokens)
            return rest, ""
        return "", "" if self.state == "after" else rest


def partial_tag_at_end(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (held back while streaming: the
    next chunk may complete the tag)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def split_reasoning(text: str, opened: bool = False) -> tuple[str | None, str]:
    """A whole reply as (reasoning or None when it has none, answer)."""
    splitter = ReasoningSplitter(opened)
    reasoning, answer = splitter.push(text)
    more_reasoning, more_answer = splitter.flush()
    has = opened or text.lstrip().startswith(THINK_START)
    return (reasoning + more_reasoning if has else None), answer + more_answer
