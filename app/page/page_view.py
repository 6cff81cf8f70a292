"""What one render of a tab shows (:class:`PageView`), and how each part of it goes to Gradio:
as its value, or as a ``gr.update`` of the component that shows it."""

from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr


class Sidebar(NamedTuple):
    """The chats listed (choices), the one shown, and a line under the list when it is empty."""

    choices: tuple
    selected: int | None
    note: str


class Picked(NamedTuple):
    """A list to pick from (a checkbox group's or a dropdown's) and what is picked."""

    choices: tuple
    value: object


class PageView(NamedTuple):
    """One render of a tab (Rendering.render), in the order of the components that show it
    (Wiring.view)."""

    chat: list  # the messages as the chatbot lists them
    status: str  # the status line
    sidebar: Sidebar
    versions_bar: bool  # the versions bar is shown (a message has been picked or is the last turn)
    versions_label: str
    can_continue: bool  # Continue is shown
    replying: bool  # Stop has a reply to stop: red and pressable (page.js disables it otherwise)
    previous: bool | None  # ‹: None hidden (the message has one version), False not pressable
    next: bool | None  # ›: as ‹
    chat_actions: bool  # Manage offers Rename, Delete and Export (a chat stored)
    no_chat_actions: bool  # Manage says when it will instead (a new chat)
    meter: str  # the line under the message box: the next prompt's tokens of the context
    approval: bool  # a tool call of the shown chat waits for Allow or Deny (the buttons show)
    approval_text: str  # which tool, with which arguments
    chat_tools: Picked  # the Tools panel: the tools the chat may call
    tool_choice: Picked  # ... and the one it must call first (or auto, required)

    def outputs(self, sent: set[str] | frozenset[str] | None = None) -> tuple:
        """The view as Gradio outputs; the parts not in ``sent`` (None: all) are skipped."""
        return tuple(
            as_update(name, value) if sent is None or name in sent else gr.skip()
            for name, value in zip(self._fields, self)
        )


VIEW_SIZE = len(PageView._fields)
# The view's parts sent as gr.update dicts (as_update). Within one follow these are never turned
# into gr.skip(): Gradio streams a generator's outputs as diffs, and its browser client applies a
# diff in place to the object an earlier, maybe not yet drawn, message holds: a dict -> skip diff
# deletes that message's keys, and the sidebar it carried is never drawn (tests/unit/
# test_chat_logic.py pins this). Unchanged, they are sent again whole (an empty diff).
SENT_AS_UPDATES = frozenset(
    {
        "sidebar",
        "versions_bar",
        "can_continue",
        "replying",
        "previous",
        "next",
        "chat_actions",
        "no_chat_actions",
        "approval",
        "chat_tools",
        "tool_choice",
    }
)
SHOWN_OR_HIDDEN = frozenset(
    {"versions_bar", "can_continue", "chat_actions", "no_chat_actions", "approval"}
)


def as_update(name: str, value: Any) -> Any:
    """The view's part ``name`` as Gradio takes it for the component that shows it."""
    if name == "sidebar":
        return gr.update(choices=list(value.choices), value=value.selected, info=value.note)
    if name in ("chat_tools", "tool_choice"):  # a checkbox group takes a list, not a tuple
        picked = list(value.value) if isinstance(value.value, tuple) else value.value
        return gr.update(choices=list(value.choices), value=picked)
    if name in SHOWN_OR_HIDDEN:
        return gr.update(visible=value)
    if name == "replying":  # Stop: red while the shown chat replies
        return gr.update(variant="stop" if value else "secondary")
    if name in (
        "previous",
        "next",
    ):  # ‹ ›: shown for a message with other versions, pressable towards one
        return gr.update(visible=value is not None, interactive=bool(value))
    return value
