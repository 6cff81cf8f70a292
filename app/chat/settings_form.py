"""The settings form as the page holds it (:class:`SettingsForm`: each box's value as typed) and
its reading into the store's :class:`ChatSettings`, with what is wrong with each refused value.
No Gradio here: the page's settings panel fills a SettingsForm from its boxes."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields, replace
from typing import Any

from .store import (
    DEFAULT_REPETITION_PENALTY,
    DROP_OLDEST,
    MAX_TOKENS_LIMIT,
    ChatSettings,
    shown_value,
)

# a refused value, or an emptied box, shows the value in force again (an empty seed is a value: a random one)
RESET_FIELDS = ("temperature", "top_p", "max_tokens", "top_k", "seed", "repetition_penalty")
REFILLED_WHEN_EMPTY = ("temperature", "top_p", "max_tokens", "top_k", "repetition_penalty")
_LABELS = {
    "temperature": "temperature",
    "top_p": "top-p",
    "max_tokens": "max tokens",
    "top_k": "top-k",
    "seed": "seed",
    "repetition_penalty": "repetition penalty",
}
_WHOLE = ("max_tokens", "top_k", "seed")


@dataclass(frozen=True)
class SettingsForm:
    """The settings boxes' values as the page sends them: numbers maybe empty (None, ""), typed
    text, or out of range; the stop strings as the box's text, one a line. The fields are in the
    form's order (SETTING_FIELDS); a ChatSettings field of the same name is what each becomes."""

    system_prompt: Any = ""
    temperature: Any = None
    top_p: Any = None
    max_tokens: Any = None
    thinking: Any = False
    top_k: Any = None
    seed: Any = None
    stop: Any = ""
    repetition_penalty: Any = DEFAULT_REPETITION_PENALTY
    context_policy: Any = DROP_OLDEST

    @classmethod
    def showing(cls, settings: ChatSettings) -> SettingsForm:
        """The form as it shows ``settings``."""
        values = {name: getattr(settings, name) for name in SETTING_FIELDS}
        return cls(**{**values, "stop": "\n".join(settings.stop)})

    def values(self) -> tuple:
        """The boxes' values in the form's order (the page's outputs to them)."""
        return astuple(self)


SETTING_FIELDS = tuple(f.name for f in fields(SettingsForm))  # the form's order


def stop_strings(text: str | None) -> tuple[str, ...]:
    return tuple(line for line in (text or "").splitlines() if line.strip())


def _number(name: str, value: Any, in_force: ChatSettings | None, problems: dict[str, str]) -> Any:
    """A number box's value coerced (a whole number as int), or what stands for an empty one."""
    label = _LABELS[name]
    if value is None or value == "":
        if name == "seed":  # an empty seed means a random one
            return None
        if in_force is not None:
            return getattr(in_force, name)
        if name == "top_k":  # empty top-k: off, as 0
            return 0
        problems[name] = f"{label} must be a number"
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        problems[name] = f"{label} must be a number (got {value!r})"
        return value
    return int(x) if name in _WHOLE and x.is_integer() else x


def form_settings(
    form: SettingsForm, in_force: ChatSettings | None = None
) -> tuple[ChatSettings, dict[str, str]]:
    """The settings as the form holds them (its numbers coerced) and, by field name, what is wrong
    with each invalid one (the store's own checks after the form's). An emptied number box keeps
    the value ``in_force`` (without one it is a problem; an empty top-k is off); an empty seed is
    a random one."""
    problems: dict[str, str] = {}
    numbers = {name: _number(name, getattr(form, name), in_force, problems) for name in _LABELS}
    settings = ChatSettings(
        system_prompt=form.system_prompt or "",
        thinking=bool(form.thinking),
        stop=stop_strings(form.stop),
        context_policy=form.context_policy or DROP_OLDEST,
        **numbers,
    )
    for name, text in settings.problems().items():
        problems.setdefault(name, text)
    return settings, problems


def with_backend_of(settings: ChatSettings, in_force: ChatSettings) -> ChatSettings:
    """The form's settings with what the form's fields do not hold: the chat's backend (unless
    the form names one) and its tools (the Tools panel sets those)."""
    kept = {name: getattr(in_force, name) for name in ("tools", "always_allow", "tool_choice")}
    if settings.backend is None:
        kept["backend"] = in_force.backend
    return replace(settings, **kept)


def max_tokens_problem(value: Any, context: int | None, model: str | None) -> str:
    """What is wrong with max tokens ``value``, naming the one range it must lie in: 1 to the
    context of the model serving the chat (``context``, None: not known), within the store's
    limit."""
    limit = min(context, MAX_TOKENS_LIMIT) if context else MAX_TOKENS_LIMIT
    why = (
        f", the context of {model or 'the model'}, which serves this chat"
        if limit == context
        else ""
    )
    got = "" if value is None or value == "" else f" (got {shown_value(value)})"
    return f"max tokens must be a whole number from 1 to {limit:,}{why}{got}"
