"""The view: one long-running ``follow`` event per tab renders its conversation (rendering.py:
stored messages plus the live reply) after each action and while a reply streams in it; the
once-a-second tick (ticks.py) keeps the status line and the sidebar current and has a chat changed
elsewhere redrawn. Also the page's load and the chat's layout (a tab's closing is TabState.tab_closed)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

import gradio as gr

from ..chat.view import MATH_MARK
from . import toasts
from .page_view import SENT_AS_UPDATES, VIEW_SIZE, PageView, as_update
from .scripts import (
    ASKED_CHATS_JS,
    MARK_LOADED_JS,
    REMEMBER_SHOWN_CHAT_JS,
    SAY_FILES_DROPPED_JS,
)
from .tabs import Tab, TabState
from .wiring import QUICK, Wiring

RENDER_EVERY_S = 0.25  # a page re-renders a streaming reply at most this often
FOLLOW_HANDOVER_S = 3.0  # how long a new follow waits for the one it replaces to end
# A follow that took over from another one (running, or ended less than RACE_S before) has the
# tick send the whole view once more, RECHECK_AFTER_S after it ends (see Ticks.tick).
RACE_S = 2.0
RECHECK_AFTER_S = 1.0
# Math in messages, as models write it: inline between $ … $ or \( … \), on its own line between
# $$ … $$ or \[ … \] (Gradio's default, $$ alone, left `$x^2$` as typed). Which $ … $ is math is
# decided by view.shown_literally, which puts MATH_MARKs around it: with a bare "$" as a
# delimiter, KaTeX took the text between two prices ("$5 and $10") for math.
LATEX_DELIMITERS = [
    {"left": "$$", "right": "$$", "display": True},
    {"left": "\\[", "right": "\\]", "display": True},
    {"left": MATH_MARK + "$", "right": "$" + MATH_MARK, "display": False},
    {"left": "\\(", "right": "\\)", "display": False},
]
IDLE_CHECK_S = 1.0  # how often an idle page looks at the status line


def changed_parts(now: PageView, last: PageView | None) -> set[str]:
    """The parts of the view that differ from the last render sent (None: every part)."""
    return {
        name
        for name, new, old in zip(PageView._fields, now, last or (None,) * VIEW_SIZE)
        if new != old
    }


class ViewEvents(TabState):
    """Renders a tab: the page's load, the follow after each action."""

    async def load_page(
        self,
        request: gr.Request,
        in_address: float | None = None,
        remembered: float | None = None,
        browser_tab: str | None = None,
    ):
        """The tab opens the chat its address names (a reload; 0: a new chat, whose text the
        browser keeps), else the one the browser last showed (ASKED_CHATS_JS), else the newest;
        with the files attached in the tab's page before a reload (``browser_tab``: claim_files).
        Answers with its title and settings, and the chat list with the chat shown picked: the
        step after the load writes the list's pick into the address (REMEMBER_SHOWN_CHAT_JS),
        which, left to the follow, was still the page's first (none: a new chat) then."""
        tab = self.tab(request)
        if in_address == 0 and not tab.picked:
            tab.conv_id = None
        elif not tab.picked:  # a click that came first (New chat at once) is kept
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
        self.claim_files(tab, browser_tab)  # a reload: the files attached before it
        thinking = gr.update(visible=self.source.supports_thinking)
        tab.drawn.sidebar = self.render_sidebar(tab)
        return (*self.fields(tab), thinking, as_update("sidebar", tab.drawn.sidebar))

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
            await self.take_over(previous)
            while tab.follows.follower == me:
                self.replies.page_seen(session, tab.conv_id)
                # read before rendering: a reply that ends while the render is being sent is
                # rendered once more, finished, before this loop stops
                busy = self.replies.is_busy(tab.conv_id)
                now = self.render(tab)
                if now != last:
                    yield now.outputs(changed_parts(now, last) | SENT_AS_UPDATES)
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
            self.follow_ended(tab, me, session, ended, raced)

    async def take_over(self, previous: asyncio.Event | None) -> None:
        """Let the follow this one replaces (``previous``: set when it has ended) end first: a
        render it already made (of the chat shown before) would otherwise reach the browser
        after this one's, and stay."""
        if previous is not None and not previous.is_set():
            self.replies.notify()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(previous.wait(), FOLLOW_HANDOVER_S)

    def follow_ended(
        self, tab: Tab, me: int, session: str | None, ended: bool, raced: bool
    ) -> None:
        """After follow ``me``: a follow cancelled (not ``ended``) went with its tab, closed or
        reloaded mid-reply; the tab's latest follow notes when it ended, and one that took over
        from another (``raced``) has the tick send the whole view once more a moment later."""
        if not ended:
            self.replies.page_gone(session)
        elif tab.follows.follower == me:
            tab.follows.ended_at = time.monotonic()
            if raced:
                tab.follows.recheck_at = tab.follows.ended_at + RECHECK_AFTER_S

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
            latex_delimiters=LATEX_DELIMITERS,
        )
        return SimpleNamespace(status=status, chatbot=chatbot)

    def wire_view(self, demo: gr.Blocks, w: Wiring) -> None:
        """The page's load, the tick, and the redraws it asks for."""
        c = w.chats
        loaded = demo.load(
            self.load_page,
            inputs=[c.in_address, c.remembered, c.browser_tab],
            outputs=[*w.tab_fields, w.settings.thinking, c.conv_list],
            js=ASKED_CHATS_JS,
            **QUICK,
        )
        # the chat shown, whoever chose it (a click, the load, a delete, a first message), goes to the address
        c.conv_list.change(None, inputs=c.conv_list, js=REMEMBER_SHOWN_CHAT_JS, **QUICK)
        loaded.then(**w.follow)
        # the files attached to the chat shown (a reload's, claim_files), then the note
        # of those that did not come back (page.js, sayFilesDroppedByAReload)
        loaded.then(**w.attachments_note).then(None, js=SAY_FILES_DROPPED_JS, **QUICK)
        loaded.then(None, js=MARK_LOADED_JS)
        # the list's value may not change at the load (the chat asked for was gone): the address names the chat shown
        loaded.then(None, inputs=c.conv_list, js=REMEMBER_SHOWN_CHAT_JS, **QUICK)
        self.wire_tick(w)
