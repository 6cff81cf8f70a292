"""The once-a-second tick of every tab: the status line, the sidebar when another chat starts or
ends replying, what the tab's replies have to say, and a redraw of what changed elsewhere (the chat
by a follow, its title and settings boxes by ``redraw_boxes``)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import gradio as gr

from . import toasts
from .following import IDLE_CHECK_S
from .page_view import PageView, as_update
from .scripts import (
    APPLY_REDRAWN_FIELDS_JS,
    EDITING_JS,
    FIELD_IDS,
    FOCUSED_FIELD_JS,
    TICK_ANSWERED_JS,
)
from .tabs import TabState
from .wiring import QUICK, Wiring


class Ticks(TabState):
    """The tick, the hidden boxes it reads and writes, and the redraws it asks for."""

    async def tick(self, editing: bool, request: gr.Request):
        """Every second: the status line, the sidebar when another chat starts or ends replying,
        and what the tab's replies have to say (a toast: ReplyManager.notices); tabs gone silent
        are closed (TabState.close_silent_tabs).

        Once after a follow that took over from another one, the whole view: the browser runs
        the follows of a tab as separate submissions and does not keep their order (a message of
        the older one can land after the newer one's render), so what it shows is set again.

        When the chat shown was changed elsewhere (another tab's reply, edit or delete), a
        follow redraws it (the next to last output's change starts one), and its title and
        settings boxes when they are behind (the last output's change): never while this tab's own
        follow runs, nor while a message's edit box is open (``editing``)."""
        tab = self.tab(request)
        session = request.session_hash if request is not None else None
        self.replies.page_seen(session, tab.conv_id)
        self.close_silent_tabs()
        for notice in self.replies.take_notices(session):
            toasts.inform(notice)
        following = tab.follows.following is not None and not tab.follows.following.is_set()
        if (
            tab.follows.recheck_at is not None
            and not following
            and time.monotonic() >= tab.follows.recheck_at
        ):
            tab.follows.recheck_at = None
            now = self.render(tab)
            tab.drawn.status, tab.drawn.sidebar = now.status, now.sidebar
            return (*now.outputs(), gr.skip(), gr.skip())
        self.said_deleted(
            tab, say=toasts.inform
        )  # news, refusing nothing: an Info toast, not a Warning
        redraw_chat = refresh = gr.skip()
        if not following and not editing:
            chat_behind, fields_behind = self.behind(tab)
            if chat_behind:
                tab.drawn.chat_redraws += 1
                redraw_chat = tab.drawn.chat_redraws
            if fields_behind:
                tab.drawn.refreshes += 1
                refresh = tab.drawn.refreshes
        # While the tab's follow runs, the status line is the follow's, drawn with the chat and
        # Stop in one render: the tick's own line said Ready as a reply ended, beside the reply
        # still drawn "replying…" with Stop red until the follow's next render
        status = tab.drawn.status if following else self.status_of(tab)
        side = self.render_sidebar(tab)
        # only what changed goes to the browser: a redraw there costs the engine CPU on a laptop
        view = {
            "status": status if status != tab.drawn.status else gr.skip(),
            "sidebar": as_update("sidebar", side) if side != tab.drawn.sidebar else gr.skip(),
        }
        tab.drawn.status, tab.drawn.sidebar = status, side
        return (*(view.get(name, gr.skip()) for name in PageView._fields), redraw_chat, refresh)

    async def redraw_fields(
        self, refreshes: float | None, focused: str | None, request: gr.Request
    ) -> tuple:
        """The chat changed elsewhere (the tick's redraw): its title box and settings show it as
        it is now (a deleted chat: the new chat the tab turns to). Only the boxes whose value
        changed since this tab sent or saved it, and never the one with the keyboard's focus
        (``focused``, its element id): the user may be typing in a box, and ``focused`` was read
        when the redraw was asked for (a redraw of every box would put back the stored value of a
        box typed in meanwhile: a max tokens typed just before Send would be lost)."""
        tab = self.tab(request)
        before = tab.drawn.fields_shown
        values = self.fields(tab)
        old = before[1] if before is not None and before[0] == tab.drawn.fields_shown[0] else None
        return tuple(
            gr.skip() if field_id == focused or (old is not None and value == old[i]) else value
            for i, (field_id, value) in enumerate(zip(FIELD_IDS, values))
        )

    async def redraw_boxes(
        self, refreshes: float | None, focused: str | None, request: gr.Request
    ) -> str:
        """``redraw_fields`` as the page takes it: JSON with the redraw's number and the value of
        each box sent, for APPLY_REDRAWN_FIELDS_JS, which writes each into its box unless the user
        changed that box since the redraw was asked."""
        values = await self.redraw_fields(refreshes, focused, request)
        sent = {field_id: value for field_id, value in zip(FIELD_IDS, values) if value != gr.skip()}
        return json.dumps({"n": refreshes, "values": sent})

    @staticmethod
    def signals_layout() -> SimpleNamespace:
        """Hidden boxes that carry what the page's scripts read to the server, and the tick's asks."""
        editing = gr.Checkbox(
            visible="hidden", elem_id="editing"
        )  # EDITING_JS fills it for the tick
        # the tick changes them to have the chat redrawn, and its title and settings boxes
        redraw_chat = gr.Number(0, visible="hidden", elem_id="redraw-chat")
        refresh = gr.Number(0, visible="hidden", elem_id="refresh")
        focused = gr.Textbox(
            visible="hidden", elem_id="focused-field"
        )  # FOCUSED_FIELD_JS fills it for the redraw
        return SimpleNamespace(
            editing=editing, redraw_chat=redraw_chat, refresh=refresh, focused=focused
        )

    def wire_tick(self, w: Wiring) -> None:
        """The tick, and the redraws of the chat and of its boxes that it asks for."""
        c, m = w.chats, w.main
        # The tick is queued, so that the tab's event stream opens at least once a second: Gradio
        # (6.31) closes a tab's stream when its last queued event ends, and an event accepted
        # while the browser has not yet seen that close has its messages (a render, a toast)
        # held on the server until a later queued event opens a stream: a refused setting's toast
        # or a New chat's render would never be shown. Not an event as long as the tab instead:
        # that would hold one of the browser's six connections to the server per tab, and a
        # seventh tab would never load. trigger_mode "multiple": a tick so held (it
        # was the event accepted in that moment) would stop every later tick under Gradio's
        # default ("once": no new run while one is pending), and with them the stream that brings
        # held messages: the page would stand still until the person did something. A tick does
        # not await, so two never overlap on the server.
        # show_progress_on: a tick must not mark the chat as pending (Gradio shows a pending bubble)
        ticked = gr.Timer(IDLE_CHECK_S).tick(
            self.tick,
            inputs=m.editing,
            outputs=[*w.view, m.redraw_chat, m.refresh],
            js=EDITING_JS,
            show_progress="hidden",
            show_progress_on=[m.status],
            concurrency_limit=None,
            trigger_mode="multiple",
        )
        ticked.then(None, js=TICK_ANSWERED_JS, show_progress="hidden")  # the page reaches the app
        m.redraw_chat.change(**w.follow)  # the tick saw the chat changed elsewhere: redraw it
        # its title and settings boxes behind: redrawn through a hidden box, as a box changed by
        # the user since the redraw was asked keeps what the user put there
        redraw = m.refresh.change(
            self.redraw_boxes,
            inputs=[m.refresh, m.focused],
            outputs=c.fields_redrawn,
            js=FOCUSED_FIELD_JS,
            **QUICK,
        )
        redraw.then(
            None,
            inputs=c.fields_redrawn,
            outputs=[*w.tab_fields, c.fields_redrawn],
            js=APPLY_REDRAWN_FIELDS_JS,
            **QUICK,
        )
