"""The versions bar: the message it acts on (a click on a message picks it), ‹ › to show its
other versions, and Delete message."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from ..chat.store import title_from
from ..chat.view import WINDOW, focus_of
from . import toasts
from .scripts import CONFIRM_DELETE_MESSAGE_JS
from .tabs import BUSY_HINT, TabState
from .wiring import QUICK, Wiring


class VersionsPanel(TabState):
    """Which message the versions bar acts on, and its versions."""

    async def focus(self, evt: gr.SelectData, request: gr.Request):
        """A click on a message: the versions bar now acts on it. A click on the line above a chat
        shown in part (view.earlier_line) shows WINDOW more of its messages."""
        tab = self.tab(request)
        conv = self.shown(tab)
        if not self.shows_current(tab, conv):
            return  # the click's index is into the chat as the tab showed it
        shown = self.view_of(conv, tab)
        index = evt.index if isinstance(evt.index, int) else (evt.index[0] if evt.index else -1)
        if 0 <= index < len(shown) and shown[index].earlier:
            tab.window += WINDOW
            self.replies.notify()
        elif 0 <= index < len(shown) and shown[index].source is not None:
            tab.focus = shown[index].source.id
            self.replies.notify()

    def switch_version(self, step: int, request: gr.Request):
        """‹ ›: show another version of the message the versions bar acts on. Switching the first
        message's version retitles the chat as editing it does (``retitle``): the title box gets
        the new title then."""
        tab = self.tab(request)
        conv = self.shown(tab)
        if not self.shows_current(tab, conv):
            return gr.skip()
        target = focus_of(conv, tab.focus)
        if target is None:
            return gr.skip()
        if self.replies.is_busy(conv.id):
            toasts.warn(BUSY_HINT)
            return gr.skip()
        switched = self.store.switch_version(conv.id, target.id, step)
        tab.bar_note = None  # the earlier version it named is found
        depth = target.position
        tab.focus = next((m.id for m in switched.messages if m.position == depth), None)
        shown = switched.messages[depth] if depth < len(switched.messages) else None
        title = gr.skip()
        if (
            shown is not None
            and shown.id != target.id
            and self.retitle(tab, conv, target, shown.content)
        ):
            title = title_from(shown.content)
        self.replies.notify()
        return title

    async def previous_version(self, request: gr.Request):
        return self.switch_version(-1, request)

    async def next_version(self, request: gr.Request):
        return self.switch_version(+1, request)

    async def delete_message(self, confirmed: bool | None, request: gr.Request):
        """Delete the message the versions bar acts on and what follows it; deleting a version of
        the first message retitles the chat as ✎ and ‹ › do (to the version shown after it)."""
        tab = self.tab(request)
        conv = self.shown(tab)
        if confirmed is None:  # not asked: the page saw the chat replying
            if conv is not None and self.replies.is_busy(conv.id):
                toasts.warn(BUSY_HINT)
            return gr.skip()
        if not confirmed or not self.shows_current(tab, conv):
            return gr.skip()
        target = focus_of(conv, tab.focus)
        if target is None:
            return gr.skip()
        if self.replies.is_busy(conv.id):
            toasts.warn(BUSY_HINT)
            return gr.skip()
        self.store.delete_message(conv.id, target.id)
        tab.focus = None
        after = self.store.get(conv.id).messages
        shown = after[target.position] if target.position < len(after) else None
        title = gr.skip()
        if shown is not None and self.retitle(tab, conv, target, shown.content):
            title = title_from(shown.content)
        self.replies.notify()
        return title

    @staticmethod
    def versions_layout() -> SimpleNamespace:
        with gr.Row(elem_id="versions", visible=False) as versions:
            prev_btn = gr.Button("‹", elem_id="prev-version-btn", size="sm", min_width=40, scale=0)
            versions_text = gr.Markdown("", elem_id="versions-label")
            next_btn = gr.Button("›", elem_id="next-version-btn", size="sm", min_width=40, scale=0)
            delete_msg_btn = gr.Button(
                "Delete message", elem_id="delete-message-btn", size="sm", scale=0, min_width=120
            )
        return SimpleNamespace(
            versions=versions,
            prev_btn=prev_btn,
            versions_text=versions_text,
            next_btn=next_btn,
            delete_msg_btn=delete_msg_btn,
        )

    def wire_versions(self, w: Wiring) -> None:
        c, m = w.chats, w.main
        m.chatbot.select(self.focus, **QUICK).then(**w.follow)
        m.prev_btn.click(self.previous_version, outputs=c.title_box, **QUICK).then(**w.follow)
        m.next_btn.click(self.next_version, outputs=c.title_box, **QUICK).then(**w.follow)
        m.delete_msg_btn.click(
            self.delete_message,
            inputs=c.confirmed,
            outputs=c.title_box,
            js=CONFIRM_DELETE_MESSAGE_JS,
            **QUICK,
        ).then(**w.follow)
