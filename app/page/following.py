"""The view: one long-running ``follow`` event per tab renders its conversation (stored messages
plus the live reply, app/chat/view.py) after each action and while a reply streams in it; a
once-a-second ``tick`` keeps the status line and the sidebar current and has a chat changed
elsewhere redrawn. Also the page's load and unload."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from types import SimpleNamespace

import gradio as gr

from ..chat.view import (
    can_continue,
    focus_of,
    sidebar_choices,
    version_steps,
    versions_label,
    view_messages,
    while_replying,
)
from . import toasts
from .page_view import SENT_AS_UPDATES, VIEW_SIZE, PageView, Sidebar, as_update
from .scripts import (
    APPLY_REDRAWN_FIELDS_JS,
    ASKED_CHATS_JS,
    EDITING_JS,
    FIELD_IDS,
    FOCUSED_FIELD_JS,
    MARK_LOADED_JS,
    REMEMBER_SHOWN_CHAT_JS,
)
from .tabs import Seen, Tab, TabState
from .wiring import QUICK, Wiring

RENDER_EVERY_S = 0.25  # a page re-renders a streaming reply at most this often
FOLLOW_HANDOVER_S = 3.0  # how long a new follow waits for the one it replaces to end
# A follow that took over from another one (running, or ended less than RACE_S before) has the
# tick send the whole view once more, RECHECK_AFTER_S after it ends (see ViewEvents.tick).
RACE_S = 2.0
RECHECK_AFTER_S = 1.0
IDLE_CHECK_S = 1.0  # how often an idle page looks at the status line


class ViewEvents(TabState):
    """Renders a tab: the follow, the tick, the redraw of boxes changed elsewhere, the load."""

    async def load_page(
        self, request: gr.Request, in_address: float | None = None, remembered: float | None = None
    ):
        """The tab opens the chat its address names (a reload), else the one the browser last
        showed (ASKED_CHATS_JS), else the newest."""
        tab = self.tab(request)
        if not tab.picked:  # a click that came first (New chat at once) is kept
            asked = next(
                (int(c) for c in (in_address, remembered) if c is not None and self.exists(int(c))),
                None,
            )
            convs = self.store.list() if asked is None else []
            tab.conv_id = asked if asked is not None else convs[0].id if convs else None
            if in_address is not None and asked != int(
                in_address
            ):  # a link to a deleted chat: another is shown, and said
                named = f"chat {int(in_address)}" if in_address >= 0 else "no chat"
                shown = (
                    f"“{self.store.get(tab.conv_id).title}”"
                    if tab.conv_id is not None
                    else "a new chat"
                )
                toasts.warn(
                    f"The address (?chat=) names {named}, which is not here (deleted?): showing {shown}."
                )
        thinking = gr.update(visible=self.source.supports_thinking)
        return (*self.fields(tab), thinking)

    async def follow(self, request: gr.Request):
        """Render the tab's conversation after an action, then as long as a reply streams in
        it; a newer follow of the same tab takes over. (Not one endless event per tab: Gradio
        disables a chat's ↻ and ✎ while an event that writes it is running.)"""
        tab = self.tab(request)
        session = request.session_hash if request is not None else None
        tab.follows.follower += 1
        me, last, version = tab.follows.follower, None, -1
        ended = False
        previous, tab.follows.following = tab.follows.following, asyncio.Event()
        done = tab.follows.following
        raced = previous is not None and (
            not previous.is_set() or time.monotonic() - tab.follows.ended_at < RACE_S
        )
        try:
            if previous is not None and not previous.is_set():
                # Let the follow this one replaces end first: a render it already made (of the chat
                # shown before) would otherwise reach the browser after this one's, and stay.
                self.replies.notify()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(previous.wait(), FOLLOW_HANDOVER_S)
            while tab.follows.follower == me:
                self.replies.page_seen(session, tab.conv_id)
                # read before rendering: a reply that ends while the render is being sent is
                # rendered once more, finished, before this loop stops
                busy = self.replies.is_busy(tab.conv_id)
                now = self.render(tab)
                if now != last:
                    changed = {
                        name
                        for name, new, old in zip(
                            PageView._fields, now, last or (None,) * VIEW_SIZE
                        )
                        if new != old
                    }
                    yield now.outputs(changed | SENT_AS_UPDATES)
                    last = now
                    tab.drawn.status, tab.drawn.sidebar = now.status, now.sidebar
                if not busy:
                    break
                version = await self.replies.changes(version, IDLE_CHECK_S)
                await asyncio.sleep(RENDER_EVERY_S)  # coalesce a burst of tokens into one render
            if tab.follows.follower == me:
                # what the reply just ended has to say ("nothing to add"), with the action that
                # started it: left to the once-a-second tick, a tick lost or cut short under load
                # would take the notice with it
                for notice in self.replies.take_notices(session):
                    toasts.inform(notice)
            # Gradio sends a generator's last output once more with its end (blocks.py,
            # handle_streaming_diffs(final=True); a generator that never yielded sends None for
            # each output, which blanks them), and the browser may apply that after a newer
            # follow's render: the last output of every follow leaves the chat as it is (the
            # update dicts, see SENT_AS_UPDATES, stay as rendered; a newer follow ends on its own).
            yield last.outputs(SENT_AS_UPDATES) if last is not None else (gr.skip(),) * VIEW_SIZE
            ended = True
        finally:
            done.set()
            if not ended:  # cancelled: the tab closed or reloaded mid-reply
                self.replies.page_gone(session)
            elif tab.follows.follower == me:
                tab.follows.ended_at = time.monotonic()
                if raced:
                    tab.follows.recheck_at = tab.follows.ended_at + RECHECK_AFTER_S

    async def tick(self, editing: bool, request: gr.Request):
        """Every second: the status line, the sidebar when another chat starts or ends replying,
        and what the tab's replies have to say (a toast: ReplyManager.notices).

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
        status, side = self.status_of(tab), self.render_sidebar(tab)
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

    async def unload(self, request: gr.Request) -> None:
        session = request.session_hash if request is not None else None
        self.replies.page_gone(session)
        self.tabs.pop(session or "-", None)

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
        whether Stop has a reply to stop (it looks pressable only then; it stays clickable, so
        that a Stop clicked before the page has drawn the reply still stops it), whether ‹
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
        )

    def status_of(self, tab: Tab) -> str:
        """The status line of where the shown chat's replies come from (the tick's: the chat is
        read only when the app has several backends); Generating while the chat replies here."""
        backends = self.source.backends
        if len(backends) == 1:
            status = next(iter(backends.values())).status_line()
        else:
            status = self.backend_of(self.settings_in_force(tab))[1].status_line()
        return while_replying(status) if self.replies.is_busy(tab.conv_id) else status

    @staticmethod
    def chat_layout() -> SimpleNamespace:
        """The status line and the chat."""
        # the page's first render, until its load is answered: the app's line at build time
        # ("Starting… 0/3") would be stale by then
        status = gr.Markdown("Connecting…", elem_id="status-line")
        chatbot = gr.Chatbot(
            elem_id="chatbot",
            show_label=False,
            height="70vh",
            editable="all",
            # one bubble per message: Copy copies one message (not the reply with its stats line)
            group_consecutive_messages=False,
            buttons=["copy"],
            feedback_options=None,
            placeholder="Ask anything. Replies stream in; **Stop** (or Escape) ends one at once.",
        )
        return SimpleNamespace(status=status, chatbot=chatbot)

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

    def wire_view(self, demo: gr.Blocks, w: Wiring) -> None:
        """The page's load and unload, the tick, and the redraws it asks for."""
        c = w.chats
        loaded = demo.load(
            self.load_page,
            inputs=[c.in_address, c.remembered],
            outputs=[*w.tab_fields, w.settings.thinking],
            js=ASKED_CHATS_JS,
            **QUICK,
        )
        # the chat shown, whoever chose it (a click, the load, a delete, a first message), goes to the address
        c.conv_list.change(None, inputs=c.conv_list, js=REMEMBER_SHOWN_CHAT_JS, **QUICK)
        loaded.then(**w.follow)
        loaded.then(None, js=MARK_LOADED_JS)
        # the list's value may not change at the load (the chat asked for was gone): the address names the chat shown
        loaded.then(None, inputs=c.conv_list, js=REMEMBER_SHOWN_CHAT_JS, **QUICK)
        demo.unload(self.unload)
        self.wire_tick(w)

    def wire_tick(self, w: Wiring) -> None:
        """The tick, and the redraws of the chat and of its boxes that it asks for."""
        c, m = w.chats, w.main
        # The tick is queued, so that the tab's event stream opens at least once a second: Gradio
        # (6.31) closes a tab's stream when its last queued event ends, and an event accepted
        # while the browser has not yet seen that close has its messages (a render, a toast)
        # held on the server until a later queued event opens a stream: a refused setting's toast
        # or a New chat's render would never be shown. Not an event as long as the tab instead:
        # with Gradio's heartbeat that holds two of the browser's six connections to the server
        # per tab, and a fourth tab would never load. trigger_mode "multiple": a tick so held (it
        # was the event accepted in that moment) would stop every later tick under Gradio's
        # default ("once": no new run while one is pending), and with them the stream that brings
        # held messages: the page would stand still until the person did something. A tick does
        # not await, so two never overlap on the server.
        # show_progress_on: a tick must not mark the chat as pending (Gradio shows a pending bubble)
        gr.Timer(IDLE_CHECK_S).tick(
            self.tick,
            inputs=m.editing,
            outputs=[*w.view, m.redraw_chat, m.refresh],
            js=EDITING_JS,
            show_progress="hidden",
            show_progress_on=[m.status],
            concurrency_limit=None,
            trigger_mode="multiple",
        )
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
