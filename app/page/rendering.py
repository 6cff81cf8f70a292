"""What one render of a tab shows (:class:`~.page_view.PageView`): the chat it shows, stored
messages plus the live reply (app/chat/view.py), with the status line, the sidebar, the versions
bar and the buttons that depend on them. The follow and the tick (following.py) send it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..chat.composing import with_attachments
from ..chat.reply_request import chat_tool_loop, meter_text
from ..chat.store import ChatSettings
from ..chat.tool_loop import ToolBox
from ..chat.view import (
    can_continue,
    focus_of,
    sidebar_choices,
    version_steps,
    versions_label,
    view_messages,
    while_replying,
)
from .page_view import PageView, Picked, Sidebar
from .tabs import Seen, Tab, TabState


class Rendering(TabState):
    """A tab's chat and what goes with it, as the page shows them now."""

    # the Tools panel's parts of the view (tools_panel.py)
    tools_view: Callable[[ChatSettings], tuple[Picked, Picked]]
    approval_of: Callable[[Tab], str]
    toolbox: ToolBox  # the MCP servers running now: a chat's tools count in its meter

    def render_sidebar(self, tab: Tab) -> Sidebar:
        """The chats listed, the one shown, and a line under the list when it is empty."""
        choices = tuple(sidebar_choices(self.conversations(tab), self.replies.busy_conversations()))
        note = ""
        if not choices:
            note = (
                f"No chat matches “{tab.search}”."
                if tab.search
                else "No chats yet: your first message starts one."
            )
        return Sidebar(choices, tab.conv_id, note)

    def view_of(self, conv, tab: Tab) -> list:
        """The shown conversation's messages as the page lists them (its click and edit indexes):
        its last ``tab.window`` messages, under a line that shows earlier ones (``focus``)."""
        return view_messages(
            conv, self.replies.live.get(tab.conv_id), self.replies.is_busy(tab.conv_id), tab.window
        )

    def render(self, tab: Tab) -> PageView:
        """What the tab shows: chat, status line, sidebar, versions bar, its label, Continue,
        whether Stop has a reply to stop (red, and pressable only then, page.js disableStopWhenIdle:
        also from Enter until the reply is drawn, so that a Stop clicked before then still stops
        it), whether ‹
        and › lead to another version (view.version_steps), and whether Manage offers Rename,
        Delete and Export (a chat stored) or a line saying when it will (a new chat: they would
        do nothing, Delete after asking to confirm)."""
        conv = self.shown(tab)
        chat = [v.shown for v in self.view_of(conv, tab)]
        tab.drawn.seen = (
            Seen(conv.id, tuple(m.id for m in conv.messages), conv.revision)
            if conv is not None
            else Seen(None)
        )
        side = self.render_sidebar(tab)
        focus = focus_of(conv, tab.focus)
        label = versions_label(conv, focus) if focus is not None else ""
        if focus is not None and tab.bar_note is not None and tab.bar_note[0] == focus.id:
            label = f"{label} — {tab.bar_note[1]}"
        busy = self.replies.is_busy(tab.conv_id)
        continuable = can_continue(conv) and not busy
        status = self.backend_of(self.settings_of(tab, conv))[1].status_line()
        previous, next_ = version_steps(focus)
        chat_tools, tool_choice = self.tools_view(self.settings_of(tab, conv))
        return PageView(
            chat=chat,
            status=while_replying(status) if busy else status,
            sidebar=side,
            versions_bar=focus is not None,
            versions_label=label,
            can_continue=continuable,
            replying=busy,
            previous=previous,
            next=next_,
            chat_actions=conv is not None,
            no_chat_actions=conv is None,
            meter=self.meter_of(tab, conv),
            approval=bool(approval := self.approval_of(tab)),
            approval_text=approval,
            chat_tools=chat_tools,
            tool_choice=tool_choice,
        )

    def meter_of(self, tab: Tab, conv) -> str:
        """The line under the message box for the chat shown and the text in the box (the files
        attached with it), counted again only when one of them (or its settings, or the model)
        changed. While the chat replies, its stored reply changes at every piece: the chat is
        counted up to the question (keyed by its messages, not their revision), and with the
        reply once it ends."""
        settings = self.settings_of(tab, conv)
        source = self.backend_of(settings)[1]
        typed = with_attachments(tab.meter.typed, tab.draft.attachments)
        loop = chat_tool_loop(settings, self.toolbox, source)
        chat = None
        if conv is not None:
            replying = self.replies.is_busy(conv.id)
            chat = (conv.id, tuple(m.id for m in conv.messages) if replying else conv.revision)
            if replying and conv.messages and conv.messages[-1].role == "assistant":
                # the reply being written counts once it ends: the same count whenever the line
                # is drawn (and one begun without a word is not one stopped before its first,
                # whose question the model would not read: view.seen_messages)
                conv = replace(conv, messages=conv.messages[:-1])
        key = (
            chat,
            settings,
            typed,
            source.model_name,
            tuple(t.name for t in loop.tools) if loop is not None else (),
        )
        if key != tab.meter.key:
            text = meter_text(conv, settings, typed, source, loop)
            # an empty line (no tokenizer loaded yet) is counted again at the next render
            tab.meter.key, tab.meter.text = (key if text else None), text
        return tab.meter.text

    def status_of(self, tab: Tab) -> str:
        """The status line of where the shown chat's replies come from (the tick's: the chat is
        read only when the app has several backends); Generating while the chat replies here."""
        backends = self.source.backends
        if len(backends) == 1:
            status = next(iter(backends.values())).status_line()
        else:
            status = self.backend_of(self.settings_in_force(tab))[1].status_line()
        return while_replying(status) if self.replies.is_busy(tab.conv_id) else status
