"""What the panels' events share: the page's components (by panel), how every quick event runs,
and the follow that renders the tab after one (ViewEvents.follow)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import gradio as gr

from .scripts import APPLY_DRAFT_JS, RESTORE_DRAFT_JS

# Queued (toasts need the queue) but never waiting behind one another; and never dropped:
# Gradio's default trigger_mode "once" ignores an event while its previous run is pending, so a
# message sent (or a follow started) while the last one still runs would be lost, and the page
# would keep showing a stale chat.
QUICK: dict[str, Any] = dict(
    show_progress="hidden", concurrency_limit=None, trigger_mode="multiple"
)


@dataclass
class Wiring:
    """The page's components, each panel's in its own namespace (its ``*_layout``), and the
    events every panel chains after its own."""

    chats: SimpleNamespace
    settings: SimpleNamespace
    models: SimpleNamespace
    main: SimpleNamespace
    follow_fn: Callable[..., Any]  # ViewEvents.follow
    attachments_note_fn: Callable[..., Any]  # Attachments.attachments_note
    tools: SimpleNamespace | None = None  # the Tools panel's (tools_panel.py)

    @property
    def follow(self) -> dict[str, Any]:
        """The arguments of a follow event (``.then(**wiring.follow)``), which renders the tab."""
        return dict(
            fn=self.follow_fn,
            outputs=self.view,
            show_progress="hidden",
            concurrency_limit=None,
            trigger_mode="multiple",
        )

    @property
    def attachments_note(self) -> dict[str, Any]:
        """The arguments of an event that redraws the line naming the files attached."""
        return dict(
            fn=self.attachments_note_fn,
            outputs=[
                self.main.attached,
                self.main.unattach_btn,
                self.main.too_long,
                self.main.too_long_text,
                self.main.meter,
            ],
            **QUICK,
        )

    @property
    def view(self) -> list:
        """The components a render goes to, in PageView's order."""
        c, m = self.chats, self.main
        return [
            m.chatbot,
            m.status,
            c.conv_list,
            m.versions,
            m.versions_text,
            m.continue_btn,
            m.stop_btn,
            m.prev_btn,
            m.next_btn,
            c.actions,
            c.no_actions,
            m.meter,
            m.approval,
            m.approval_text,
            self.tools.picked,
            self.tools.forced,
        ]

    @property
    def tab_fields(self) -> list:
        """The title box, the settings boxes and the backend: TabState.fields' outputs."""
        return [self.chats.title_box, *self.settings.fields, self.settings.backend]

    @property
    def shown_fields(self) -> list:
        """The outputs of an event that may show another chat: the message box's answer, then its fields."""
        return [self.chats.shown_draft, *self.tab_fields]

    def with_form(self, **before: Any) -> dict[str, Any]:
        """An event's ``inputs_kwargs``: the components named in ``before``, then the settings
        boxes by field name (a handler gathers them with ``**form`` into one SettingsForm). The
        page's scripts (scripts.py) see the inputs in this order: positional ones, then these."""
        return {**before, **self.settings.boxes}

    def form_then(self, **after: Any) -> dict[str, Any]:
        """As ``with_form``, with the settings boxes before the components named in ``after``."""
        return {**self.settings.boxes, **after}

    def then_redraw(self, event: gr.events.Dependency, draft: bool = False) -> None:
        """After an event that may show another chat (or send the files attached): the chat,
        and the attachment note (the files attached are those kept for the chat shown); with
        ``draft``, the message box the event took: what its answer gives back (the draft of
        the chat shown, a message not sent) before what was typed since (APPLY_DRAFT_JS)."""
        if draft:
            event.then(None, inputs=self.chats.shown_draft, js=APPLY_DRAFT_JS, **QUICK)
            event.failure(None, js=RESTORE_DRAFT_JS, **QUICK)
        event.then(**self.follow)
        event.then(**self.attachments_note)
