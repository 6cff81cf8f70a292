"""The chat page (Gradio), mounted on the same FastAPI app as the OpenAI routes.

The page is a view. Each tab has a :class:`Tab` on the server saying which conversation it
shows; one long-running ``watch`` event per tab renders that conversation (stored messages plus
the live reply, app/chat/view.py) whenever anything changes. Replies run apart from the page
(app/chat/live.py), so the chat shown is always the one selected, whatever streams elsewhere.

Every other event changes state (the store, the tab, the replies) and returns quickly; a refused
action says why in a toast (``gr.Warning``) and leaves the page as it was. The UI talks to the
engine only through the front end's ``FrontendClient.generate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from minisgl_engine import GenerateRequest, SamplingParams

from ..chat.live import ReplyManager, Turn
from ..model_pull import ModelPuller, PullError, PullProgress
from .scripts import (APPLY_DRAFT_JS, APPLY_REDRAWN_FIELDS_JS, ASKED_CHATS_JS, CLICK_DOWNLOAD_JS, CONFIRM_DELETE_CHAT_JS, EDITING_JS, FIELD_IDS, FOCUSED_FIELD_JS, LEAVE_CHAT_IMPORT_JS, LEAVE_CHAT_NEW_JS, LEAVE_CHAT_SELECT_JS, MARK_LOADED_JS, REMEMBER_SHOWN_CHAT_JS, RESTORE_DRAFT_JS, SEND_JS, STAMP_JS, SYNC_SEND_JS, confirm_js)
from ..chat.store import (IMPORT_LIMIT_BYTES, REPETITION_PENALTY_MAX, BadImportFile,
                    ChatSettings, ConversationStore, NotFoundError, plural, title_from)
from ..chat.reply_source import ModelEntry, ModelError, ReplySource
from ..chat.uploads import NotUploaded, Uploads
from .gradio_patches import check_uploads_as_launched, let_sliders_take_typed_values
from ..chat.settings_form import (REFILLED_WHEN_EMPTY, RESET_FIELDS, SETTING_FIELDS, SettingsForm, form_settings,
                                  max_tokens_problem, with_backend_of)
from .page_view import SENT_AS_UPDATES, VIEW_SIZE, PageView, Sidebar, as_update
from ..chat.view import (WINDOW, can_continue, engine_messages, focus_of, markdown_literal, model_choices, sidebar_choices,
                   typed_text, version_steps, versions_label, view_messages, while_replying)

RENDER_EVERY_S = 0.25  # a page re-renders a streaming reply at most this often
FOLLOW_HANDOVER_S = 3.0  # how long a new follow waits for the one it replaces to end
# A follow that took over from another one (running, or ended less than RACE_S before) has the
# tick send the whole view once more, RECHECK_AFTER_S after it ends (see ChatPage.tick).
RACE_S = 2.0
RECHECK_AFTER_S = 1.0
IDLE_CHECK_S = 1.0  # how often an idle page looks at the status line
PULL_SHOW_S = 0.5  # a pull's progress line is shown at most this often
BUSY_HINT = "This chat is replying: press Stop (or Escape) first."
# Several tabs may show one chat. An action on what a tab shows is refused when the chat changed
# since (ChatPage.shows_current); an idle tab redraws a chat changed elsewhere (ChatPage.tick).
CHANGED_ELSEWHERE = "This chat changed in another tab — it has been reloaded. Look it over, then try again."
SEND_CHANGED_ELSEWHERE = ("This chat changed in another tab — it has been reloaded. Your message is still in the box: "
                          "send it again to add it to the chat as it is now.")
DELETED_ELSEWHERE = "This chat was deleted in another tab."
SEND_DELETED_ELSEWHERE = DELETED_ELSEWHERE + " Your message is still in the box: send it again to start a new chat with it."
# an edit refused (✎'s box closes on Save) keeps its text in the message box (ChatPage.kept_edit)
EDIT_KEPT = ("Your edit was not saved: its text is now in the message box, to copy into ✎ on the message once you have "
             "looked the chat over.")
# Manage's line for a new chat, in place of Rename, Delete and Export
NO_CHAT_ACTIONS = "This chat is stored when you send its first message: then you can rename, delete or export it."
DOUBLE_SEND_MS = 1000  # the same text sent again within this is a double click or Enter, not a second message
ATTACH_LIMIT_BYTES = 1_000_000
# Import and Attach take any file and say what is wrong with one they refuse: with Gradio's
# file_types a file of another type was refused by Gradio first, in a red "Error" toast.
IMPORTABLE = "a chat exported here as JSON (Export JSON) or an OpenAI-style JSON file ({\"messages\": [...]})"

@dataclass(frozen=True)
class Seen:
    """What a tab's last render showed: the chat, its messages (ids, in order) and its revision
    (the store's write count) then."""

    conv_id: int | None
    path: tuple[int, ...] = ()
    revision: int | None = None


@dataclass
class Tab:
    """What one browser tab shows: a conversation, or (None) a new chat not stored yet, with
    the settings it will start with."""

    conv_id: int | None = None
    new_chat_settings: ChatSettings | None = None  # the settings its new chat (conv_id None) starts with
    focus: int | None = None  # the message the versions bar acts on (None: view.focus_of's choice)
    # (message, note) the versions bar adds to its label while it acts on that message: where the
    # messages after an edited one went (ChatPage.edit; a toast there covered the edited message)
    bar_note: tuple[int, str] | None = None
    search: str = ""  # what the sidebar is filtered by
    window: int = WINDOW  # how many of the shown chat's last messages the chat shows (view.windowed)
    attachments: list[tuple[str, str]] = field(default_factory=list)  # (file name, text) for the next message
    follower: int = 0  # which follow event renders the tab now
    sidebar: tuple | None = None  # the sidebar as last sent
    status: str | None = None  # the status line as last sent
    following: asyncio.Event | None = None  # set when the tab's latest follow event has ended
    ended_at: float = 0.0  # when (monotonic s) a follow of the tab last ended
    recheck_at: float | None = None  # when the tick sends the whole view once more (monotonic s)
    early_stop: float = 0.0  # browser time (ms) of the tab's last Stop that found no reply to stop
    picked: bool = False  # the user has chosen what the tab shows (the page's load keeps it then)
    # the chat shown before the last click that changed it (None: a new chat), and that click's
    # browser time (ms): a settings box left by that click belongs to the chat shown before
    shown_before: int | None = None
    shown_since: float = 0.0
    # browser time (ms) of the newest settings save applied: each save carries every box, so an
    # older one taken after it (Gradio runs them at once) would put back the values it replaced
    settings_stamp: float = 0.0
    # the settings form whose save was last refused with a toast (None: the last save was not
    # refused): New chat, clicked as that box was left, does not say it again
    refused_form: SettingsForm | None = None
    # the last message sent: (chat, text, browser time in ms of its click or Enter), to drop the
    # second send of a double click or a double Enter (the box empties only when the first is done)
    last_send: tuple[int, str, float] | None = None
    seen: Seen | None = None  # what the tab's last render showed
    lost: bool = False  # the chat it showed was found deleted (by another tab): not said yet
    # the tick's counts of redraws asked for: of the chat (a change of it starts a follow) and of
    # its title and settings boxes (a change of it starts redraw_boxes)
    chat_redraws: int = 0
    refreshes: int = 0
    # the chat whose title and settings the page's boxes show, and their values (FIELD_IDS' order)
    # as this tab last sent or saved them: a redraw sends only the boxes changed elsewhere since
    fields_shown: tuple[int | None, tuple] | None = None
    # what the message box held when the tab left each chat (None: its new chat), unsent: put back
    # when the tab shows that chat again (ChatPage.swap_draft)
    unsent: dict[int | None, str] = field(default_factory=dict)
    unsent_files: dict[int | None, list[tuple[str, str]]] = field(default_factory=dict)  # and the files attached there


class ChatPage:
    """The page's state and event handlers; ``build`` lays it out."""

    def __init__(self, source: ReplySource, store: ConversationStore, puller: ModelPuller | None = None) -> None:
        self.source = source  # where replies come from: the local engine or a remote server
        self.store = store
        self.puller = puller  # pulls models onto this machine (None: a remote engine's models are the remote's)
        self.listed: dict[str, ModelEntry] = {}  # the panel's last listing, by model name
        self.replies = ReplyManager(store, source.generate)
        self.tabs: dict[str, Tab] = {}
        self.uploads = Uploads()  # the files Attach and Import may read (build: Gradio's upload list)

    # ---- state of one tab

    def tab(self, request: gr.Request | None) -> Tab:
        key = request.session_hash if request is not None and request.session_hash else "-"
        return self.tabs.setdefault(key, Tab(new_chat_settings=self.store.default_settings()))

    def shown(self, tab: Tab):
        """The tab's conversation (None for a new chat); a deleted one turns the tab to a new chat."""
        if tab.conv_id is None:
            return None
        try:
            return self.store.get(tab.conv_id)
        except NotFoundError:
            tab.conv_id, tab.lost = None, True
            return None

    def shows_current(self, tab: Tab, conv, appending: bool = False, note: str = "") -> bool:
        """Whether ``conv`` (the tab's chat, just read) has the messages the tab's last render
        showed, so that an action on them acts on what the user sees; ``appending`` (a new
        message goes at the end): the shown ones, maybe followed by more. Else another tab changed
        or deleted the chat: a toast says so (then ``note``) and the page shows the chat as it is now."""
        if self.said_deleted(tab, SEND_DELETED_ELSEWHERE if appending else f"{DELETED_ELSEWHERE} {note}".strip()):
            return False
        seen = tab.seen
        if conv is None or seen is None or seen.conv_id != conv.id:
            return True  # nothing shown of this chat yet (a click that showed it is being answered)
        path = tuple(m.id for m in conv.messages)
        if (path[:len(seen.path)] if appending else path) == seen.path:
            return True
        warn(SEND_CHANGED_ELSEWHERE if appending else f"{CHANGED_ELSEWHERE} {note}".strip())
        self.replies.notify()
        return False

    def said_deleted(self, tab: Tab, message: str = DELETED_ELSEWHERE, say: Callable[[str], None] | None = None) -> bool:
        """Say (once) that the chat the tab showed was deleted elsewhere; whether it was. ``say``:
        the toast (``warn`` by default: an action refused for it)."""
        if tab.lost:
            tab.lost = False
            (say or warn)(message)
            return True
        return False

    def behind(self, tab: Tab) -> tuple[bool, bool]:
        """Whether the tab's chat was written to (or deleted) since its last render, and whether
        its title and settings boxes are behind what was last sent (``fields``): one read of its
        revision. Apart, because a redraw of the chat is a follow, and Gradio disables ✎ and ↻
        while one runs: the title of a chat's first message alone redrew the whole chat just
        after its first reply, and a click on ✎ in that moment did nothing (a CI failure). (A
        render may find the change first, a deleted chat too: the fields still show it as it was.)"""
        if tab.conv_id is None:
            return False, tab.fields_shown is not None and tab.fields_shown[0] is not None  # they show a chat deleted since
        try:
            heading = self.store.heading(tab.conv_id)
        except NotFoundError:
            return True, True
        seen = tab.seen
        chat_behind = seen is not None and seen.conv_id == tab.conv_id and seen.revision != heading.revision
        fields = (tab.conv_id, self.field_values(heading.title, heading.settings))
        fields_behind = tab.fields_shown is not None and tab.fields_shown != fields
        return chat_behind, fields_behind

    def settings_in_force(self, tab: Tab) -> ChatSettings:
        """The settings of the tab's conversation, or of its new chat."""
        return self.settings_of(tab, self.shown(tab))

    def settings_of(self, tab: Tab, conv) -> ChatSettings:
        """The settings of ``conv`` (the tab's, already read), or of the tab's new chat."""
        return conv.settings if conv is not None else (tab.new_chat_settings or self.store.default_settings())

    def backend_of(self, settings: ChatSettings) -> tuple[str, ReplySource]:
        """Where a chat's replies come from: the backend its settings name, else the first."""
        backends = self.source.backends
        name = settings.backend if settings.backend in backends else next(iter(backends))
        return name, backends[name]

    def fields(self, tab: Tab) -> tuple:
        """Title, settings fields and backend for the tab's conversation (sent to the page: the
        tab remembers which chat, with which values, they show)."""
        conv = self.shown(tab)
        values = self.field_values(conv.title if conv is not None else "", self.settings_of(tab, conv))
        tab.fields_shown = (conv.id if conv is not None else None, values)
        return values

    def field_values(self, title: str, s: ChatSettings) -> tuple:
        """What the title box, the settings boxes and the backend show for a chat (FIELD_IDS' order)."""
        return (title, *SettingsForm.showing(s).values(), self.backend_of(s)[0])

    def note_fields(self, tab: Tab, conv_id: int | None, title: str | None = None, settings: ChatSettings | None = None) -> None:
        """This tab wrote ``conv_id``'s title or settings as its boxes show them: those boxes are
        not behind (a redraw would send them back, over a value typed meanwhile). Only what it
        wrote: another tab's change to the rest is still redrawn."""
        if tab.fields_shown is None or tab.fields_shown[0] != conv_id:
            return
        values = tab.fields_shown[1]
        if title is not None:
            values = (title, *values[1:])
        if settings is not None:
            values = (values[0], *self.field_values("", settings)[1:])
        tab.fields_shown = (conv_id, values)

    def conversations(self, tab: Tab):
        return self.store.search(tab.search) if tab.search else self.store.list()

    # ---- the view: one long event per tab

    async def follow(self, request: gr.Request):
        """Render the tab's conversation after an action, then as long as a reply streams in
        it; a newer follow of the same tab takes over. (Not one endless event per tab: Gradio
        disables a chat's ↻ and ✎ while an event that writes it is running.)"""
        tab = self.tab(request)
        session = request.session_hash if request is not None else None
        tab.follower += 1
        me, last, version = tab.follower, None, -1
        ended = False
        previous, tab.following = tab.following, asyncio.Event()
        done = tab.following
        raced = previous is not None and (not previous.is_set() or time.monotonic() - tab.ended_at < RACE_S)
        try:
            if previous is not None and not previous.is_set():
                # Let the follow this one replaces end first: a render it already made (of the chat
                # shown before) would otherwise reach the browser after this one's, and stay.
                self.replies.notify()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(previous.wait(), FOLLOW_HANDOVER_S)
            while tab.follower == me:
                self.replies.page_seen(session, tab.conv_id)
                # read before rendering: a reply that ends while the render is being sent is
                # rendered once more, finished, before this loop stops
                busy = self.replies.is_busy(tab.conv_id)
                now = self.render(tab)
                if now != last:
                    changed = {name for name, new, old in zip(PageView._fields, now, last or (None,) * VIEW_SIZE) if new != old}
                    yield now.outputs(changed | SENT_AS_UPDATES)
                    last = now
                    tab.status, tab.sidebar = now.status, now.sidebar
                if not busy:
                    break
                version = await self.replies.changes(version, IDLE_CHECK_S)
                await asyncio.sleep(RENDER_EVERY_S)  # coalesce a burst of tokens into one render
            if tab.follower == me:
                # what the reply just ended has to say ("nothing to add"), with the action that
                # started it: left to the once-a-second tick, a tick lost or cut short under load
                # took the notice with it
                for notice in self.replies.take_notices(session):
                    inform(notice)
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
            elif tab.follower == me:
                tab.ended_at = time.monotonic()
                if raced:
                    tab.recheck_at = tab.ended_at + RECHECK_AFTER_S

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
            inform(notice)
        following = tab.following is not None and not tab.following.is_set()
        if tab.recheck_at is not None and not following and time.monotonic() >= tab.recheck_at:
            tab.recheck_at = None
            now = self.render(tab)
            tab.status, tab.sidebar = now.status, now.sidebar
            return (*now.outputs(), gr.skip(), gr.skip())
        self.said_deleted(tab, say=inform)  # news, refusing nothing: an Info toast, not a Warning
        redraw_chat = refresh = gr.skip()
        if not following and not editing:
            chat_behind, fields_behind = self.behind(tab)
            if chat_behind:
                tab.chat_redraws += 1
                redraw_chat = tab.chat_redraws
            if fields_behind:
                tab.refreshes += 1
                refresh = tab.refreshes
        status, side = self.status_of(tab), self.render_sidebar(tab)
        # only what changed goes to the browser: a redraw there costs the engine CPU on a laptop
        view = {"status": status if status != tab.status else gr.skip(),
                "sidebar": as_update("sidebar", side) if side != tab.sidebar else gr.skip()}
        tab.status, tab.sidebar = status, side
        return (*(view.get(name, gr.skip()) for name in PageView._fields), redraw_chat, refresh)

    async def redraw_fields(self, refreshes: float | None, focused: str | None, request: gr.Request) -> tuple:
        """The chat changed elsewhere (the tick's redraw): its title box and settings show it as
        it is now (a deleted chat: the new chat the tab turns to). Only the boxes whose value
        changed since this tab sent or saved it, and never the one with the keyboard's focus
        (``focused``, its element id): the user may be typing in a box, and ``focused`` was read
        when the redraw was asked for (a redraw of every box put back the stored value of a box
        typed in meanwhile: a max tokens typed just before Send was lost)."""
        tab = self.tab(request)
        before = tab.fields_shown
        values = self.fields(tab)
        old = before[1] if before is not None and before[0] == tab.fields_shown[0] else None
        return tuple(gr.skip() if field_id == focused or (old is not None and value == old[i]) else value
                     for i, (field_id, value) in enumerate(zip(FIELD_IDS, values)))

    async def redraw_boxes(self, refreshes: float | None, focused: str | None, request: gr.Request) -> str:
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
            note = f"No chat matches “{tab.search}”." if tab.search else "No chats yet: your first message starts one."
        return Sidebar(choices, tab.conv_id, note)

    def view_of(self, conv, tab: Tab) -> list:
        """The shown conversation's messages as the page lists them (its click and edit indexes):
        its last ``tab.window`` messages, under a line that shows earlier ones (``focus``)."""
        return view_messages(conv, self.replies.live.get(tab.conv_id), self.replies.is_busy(tab.conv_id), tab.window)

    def render(self, tab: Tab) -> PageView:
        """What the tab shows: chat, status line, sidebar, versions bar, its label, Continue,
        whether Stop has a reply to stop (it looks pressable only then; it stays clickable, so
        that a Stop clicked before the page has drawn the reply still stops it), whether ‹
        and › lead to another version (view.version_steps), and whether Manage offers Rename,
        Delete and Export (a chat stored) or a line saying when it will (a new chat: they did
        nothing, or Delete asked to confirm and then did nothing)."""
        conv = self.shown(tab)
        chat = [v.shown for v in self.view_of(conv, tab)]
        tab.seen = Seen(conv.id, tuple(m.id for m in conv.messages), conv.revision) if conv is not None else Seen(None)
        side = self.render_sidebar(tab)
        focus = focus_of(conv, tab.focus)
        label = versions_label(conv, focus) if focus is not None else ""
        if focus is not None and tab.bar_note is not None and tab.bar_note[0] == focus.id:
            label = f"{label} — {tab.bar_note[1]}"
        busy = self.replies.is_busy(tab.conv_id)
        continuable = can_continue(conv) and not busy
        status = self.backend_of(self.settings_of(tab, conv))[1].status_line()
        previous, next_ = version_steps(focus)
        return PageView(chat=chat, status=while_replying(status) if busy else status, sidebar=side,
                        versions_bar=focus is not None, versions_label=label, can_continue=continuable, replying=busy,
                        previous=previous, next=next_, chat_actions=conv is not None, no_chat_actions=conv is None)

    def status_of(self, tab: Tab) -> str:
        """The status line of where the shown chat's replies come from (the tick's: the chat is
        read only when the app has several backends); Generating while the chat replies here."""
        backends = self.source.backends
        if len(backends) == 1:
            status = next(iter(backends.values())).status_line()
        else:
            status = self.backend_of(self.settings_in_force(tab))[1].status_line()
        return while_replying(status) if self.replies.is_busy(tab.conv_id) else status

    # ---- conversations

    async def load_page(self, request: gr.Request, in_address: float | None = None, remembered: float | None = None):
        """The tab opens the chat its address names (a reload), else the one the browser last
        showed (ASKED_CHATS_JS), else the newest."""
        tab = self.tab(request)
        if not tab.picked:  # a click that came first (New chat at once) is kept
            asked = next((int(c) for c in (in_address, remembered) if c is not None and self.exists(int(c))), None)
            convs = self.store.list() if asked is None else []
            tab.conv_id = asked if asked is not None else convs[0].id if convs else None
            if in_address is not None and asked != int(in_address):  # a link to a deleted chat showed another, unsaid
                named = f"chat {int(in_address)}" if in_address >= 0 else "no chat"
                shown = f"“{self.store.get(tab.conv_id).title}”" if tab.conv_id is not None else "a new chat"
                warn(f"The address (?chat=) names {named}, which is not here (deleted?): showing {shown}.")
        thinking = gr.update(visible=self.source.supports_thinking)
        return (*self.fields(tab), thinking)

    def exists(self, conv_id: int) -> bool:
        try:
            self.store.revision(conv_id)
        except NotFoundError:
            return False
        return True

    def show(self, tab: Tab, conv_id: int | None, clicked_at: float | None, text: str | None = None):
        """The tab shows ``conv_id`` from the click at ``clicked_at`` (browser ms) on. The message
        box's ``text`` and the files attached stay with the chat shown before; what the box is to
        show now, for the page (``draft_for_box``; the files: ``swap_attachments``)."""
        box = self.swap_draft(tab, conv_id, text)
        self.swap_attachments(tab, conv_id)
        tab.shown_before, tab.shown_since = tab.conv_id, clicked_at or 0.0
        tab.conv_id, tab.focus, tab.picked, tab.bar_note = conv_id, None, True, None
        tab.window = WINDOW
        self.replies.notify()
        return self.draft_for_box(clicked_at, text, box)

    @staticmethod
    def draft_for_box(clicked_at: float | None, text: str | None, draft: str | None):
        """The answer to an event that took the message box's text (a click that may show another
        chat, Send), for the page: the event emptied the box (window.minisglTakeBox), and
        APPLY_DRAFT_JS puts ``draft`` there, before anything typed since; ``draft`` None gives the
        event's ``text`` back (the chat shown did not change, the message was not sent). JSON
        with the event's stamp, which names the event the answer is for. A caller that sent no box
        (``text`` None) leaves it."""
        if text is None:
            return gr.skip()
        return json.dumps({"at": clicked_at, "draft": text if draft is None else draft})

    @staticmethod
    def swap_attachments(tab: Tab, conv_id: int | None) -> None:
        """Files attached belong to their chat's draft, as its text does: those of the chat the
        tab leaves are kept for it, and those kept for ``conv_id`` are attached again (they were
        dropped, with a warning, and had to be attached again)."""
        if conv_id == tab.conv_id:
            return
        if tab.attachments:
            tab.unsent_files[tab.conv_id] = tab.attachments
        else:
            tab.unsent_files.pop(tab.conv_id, None)
        tab.attachments = tab.unsent_files.pop(conv_id, [])

    @staticmethod
    def swap_draft(tab: Tab, conv_id: int | None, text: str | None) -> str | None:
        """A draft belongs to its chat: the message box's ``text`` (None: not known) is kept for
        the chat the tab leaves, and the box is to show the unsent text of ``conv_id`` (empty when
        it has none; None: the chat shown does not change, the box keeps its text). The message
        just sent from the box is no draft (a click on another chat can reach the server while the
        box still shows it)."""
        if text is None or conv_id == tab.conv_id:
            return None
        sent = tab.last_send is not None and tab.last_send[:2] == (tab.conv_id, text.strip())
        if text.strip() and not sent:
            tab.unsent[tab.conv_id] = text
        else:
            tab.unsent.pop(tab.conv_id, None)
        return tab.unsent.pop(conv_id, "")

    async def select(self, conv_id: int | None, clicked_at: float | None, request: gr.Request, text: str | None = None):
        """A click on a chat in the sidebar: the tab shows it (its draft in the message box)."""
        tab = self.tab(request)
        box = self.show(tab, conv_id, clicked_at, text)
        return (box, *self.fields(tab))

    async def new_chat(self, clicked_at: float | None, request: gr.Request, text: str | None = None,
                       form: SettingsForm | None = None):
        """New chat starts from the settings of the chat shown (its backend too), as in peer apps:
        a user who changed them need not set them again for every chat. ``form``: the settings
        boxes as the click found them, so a value just typed counts even
        when its box's save comes after the click (the new chat started from the value before
        it); a value the checks refuse is the one in force (its save says why)."""
        tab = self.tab(request)
        start_with = self.settings_in_force(tab)
        if form is not None:
            settings, problems = self.checked_form(form, start_with)
            if form != tab.refused_form:  # else the box's own save said why, just before the click
                self.settings_refused(problems)  # the box left by this click may save nothing (settings_changed)
            start_with = with_backend_of(replace(settings, **{name: getattr(start_with, name) for name in problems}), start_with)
        tab.new_chat_settings, tab.refused_form = start_with, None
        box = self.show(tab, None, clicked_at, text)
        return (box, *self.fields(tab))

    async def rename(self, title: str, request: gr.Request):
        tab = self.tab(request)
        title = (title or "").strip()
        if tab.conv_id is None:
            warn("Start a chat first, then rename it.")
        elif not title:
            warn("A title cannot be empty.")
        else:
            if len(title) > TITLE_LIMIT:  # said, not done silently: a tour's 500-letter title lost its end unseen
                inform(f"The title keeps its first {TITLE_LIMIT} characters.")
            self.store.rename(tab.conv_id, title[:TITLE_LIMIT])
        tab.sidebar = self.render_sidebar(tab)
        conv = self.shown(tab)  # the box shows the title the chat has (a refused one is put back)
        if conv is not None:
            self.note_fields(tab, conv.id, title=conv.title)
        return as_update("sidebar", tab.sidebar), conv.title if conv is not None else ""

    async def delete(self, confirmed: bool, clicked_at: float | None, request: gr.Request, text: str | None = None):
        tab = self.tab(request)
        if not confirmed or tab.conv_id is None:  # the page emptied the box of a confirmed click: given back
            return (self.draft_for_box(clicked_at, text, None) if confirmed else gr.skip(), *self.fields(tab))
        deleted = tab.conv_id
        self.replies.stop_all(deleted)
        try:
            self.store.delete(deleted)
        except NotFoundError:
            pass
        convs = self.store.list()
        # no toast: the page asked first (CONFIRM_DELETE_CHAT_JS) and the chat leaves the sidebar;
        # a toast opened over the top of the chat shown next, on its first message's buttons
        box = self.show(tab, convs[0].id if convs else None, clicked_at, text)
        tab.unsent.pop(deleted, None)  # the deleted chat's draft goes with it, its files too
        tab.unsent_files.pop(deleted, None)
        return (box, *self.fields(tab))

    def export(self, kind: str, request: gr.Request):
        """Write the shown chat to a file for the hidden download link, which the page clicks."""
        conv = self.shown(self.tab(request))
        if conv is None or not conv.messages:
            warn("Nothing to export yet: this chat has no messages.")
            return gr.skip()
        text = self.store.export_markdown(conv.id) if kind == "md" else self.store.export_json(conv.id)
        # inside the app's private files folder (GRADIO_TEMP_DIR, app/cli.py), removed at exit
        folder = Path(tempfile.mkdtemp(prefix="export-", dir=os.environ.get("GRADIO_TEMP_DIR")))
        path = folder / f"{export_stem(conv.title)}.{kind}"
        path.write_text(text, encoding="utf-8")
        return str(path)

    async def settings_changed(self, form: SettingsForm, clicked_at: float | None, request: gr.Request) -> tuple:
        """Save the fields when one is committed (a box left or Enter, a slider let go: ``_wire``),
        not on every key: a value typed digit by digit is never saved by its prefixes. A refused
        value is not saved; one toast says why and the box shows the value in force again, as an
        emptied box does (it saves nothing). A box left by a click on another chat
        (``clicked_at``, browser ms, no later than that click's) holds the settings of the chat
        shown before: they go there, whichever event the server takes first."""
        keep = (gr.skip(),) * len(SETTING_FIELDS)
        tab = self.tab(request)
        if clicked_at is not None and clicked_at <= tab.shown_since:  # the boxes show another chat now
            try:
                before = self.store.get(tab.shown_before).settings if tab.shown_before is not None else None
            except NotFoundError:
                before = None
            if before is None:  # a new chat left unsent (or a chat deleted): nothing to keep
                return keep
            settings, problems = self.checked_form(form, before)
            if not self.settings_refused(problems):
                self.store_settings(tab, tab.shown_before, settings)
            return keep
        if clicked_at is not None and clicked_at < tab.settings_stamp:
            return keep  # a newer save (of another box) carried this box's value too, and is applied
        settings, problems = self.checked_form(form, self.settings_in_force(tab))
        if self.save_settings(tab, settings, problems) and clicked_at is not None:
            tab.settings_stamp = clicked_at
        tab.refused_form = form if problems else None
        in_force = self.settings_in_force(tab)
        # only boxes that must change are sent: another box may be being typed into meanwhile
        back = set(problems) | {name for name in REFILLED_WHEN_EMPTY if getattr(form, name) in (None, "")}
        return tuple(getattr(in_force, name) if name in back and name in RESET_FIELDS else gr.skip() for name in SETTING_FIELDS)

    async def backend_changed(self, backend: str | None, request: gr.Request) -> None:
        """Replies from: this chat's next replies come from ``backend`` (a reply streaming now
        goes on where it started)."""
        tab = self.tab(request)
        if backend not in self.source.backends:
            return
        self.save_settings(tab, replace(self.settings_in_force(tab), backend=backend), {})
        self.replies.notify()

    async def export_md(self, request: gr.Request):
        return self.export("md", request)

    async def export_json(self, request: gr.Request):
        return self.export("json", request)

    def checked_form(self, form: SettingsForm, in_force: ChatSettings) -> tuple[ChatSettings, dict[str, str]]:
        """``form_settings`` of ``form``, and one check it cannot make alone: max
        tokens no larger than the context of the model serving the chat (the store's limit,
        32,768, let 32,768 through for a model of 8,192). A bad max tokens, too small, too large
        or not whole, is said in one message naming one range (0 said "1 to 32768" and 9,000
        "at most 8,192": max_tokens_problem)."""
        settings, problems = form_settings(form, in_force=in_force)
        source = self.backend_of(with_backend_of(settings, in_force))[1]
        context = getattr(source, "context_len", None)  # None: a source that does not know it
        n = settings.max_tokens
        if "max_tokens" in problems or (context and isinstance(n, int) and n > context):
            problems["max_tokens"] = max_tokens_problem(n, context, source.model_name)
        return settings, problems

    def save_settings(self, tab: Tab, settings: ChatSettings, problems: dict[str, str]) -> bool:
        """Apply the fields (as ``form_settings`` read them) to the tab's chat. Invalid values are
        refused with a toast naming them and are not used; returns whether the settings are in force."""
        if self.settings_refused(problems):
            return False
        if tab.conv_id is None:
            tab.new_chat_settings = with_backend_of(settings, self.settings_of(tab, None))
            self.note_fields(tab, None, settings=tab.new_chat_settings)
        else:
            self.store_settings(tab, tab.conv_id, settings)
        return True

    @staticmethod
    def settings_refused(problems: dict[str, str]) -> bool:
        """Whether the form has invalid values; a toast names them."""
        if problems:
            warn(f"Settings not saved: {'; '.join(problems.values())}")
        return bool(problems)

    def store_settings(self, tab: Tab, conv_id: int, settings: ChatSettings) -> None:
        """Write valid settings to a stored chat (its backend kept); a chat deleted meanwhile is
        left (the tab turns to a new chat if it showed it)."""
        try:
            stored = self.store.get(conv_id).settings
            settings = with_backend_of(settings, stored)
            if stored != settings:
                self.store.update_settings(conv_id, settings)
            self.note_fields(tab, conv_id, settings=settings)
        except NotFoundError:
            if tab.conv_id == conv_id:
                tab.conv_id = None

    # ---- replies

    def turn_for(self, conv_id: int, after: int | None = None, continue_id: int | None = None):
        """The next reply of ``conv_id``, made when it starts (after any reply before it): a new
        reply to the shown chat's last message, a new version of the reply to ``after`` (a user
        message on the path), or more of reply ``continue_id``."""
        def make_turn() -> Turn | None:
            conv = self.store.get(conv_id)
            path = conv.messages
            ids = [m.id for m in path]
            cut = after if after is not None else continue_id
            if cut is not None:
                if cut not in ids:
                    return None  # that message is gone or no longer shown
                path = path[: ids.index(cut) + 1]
            if not path or path[-1].role != ("assistant" if continue_id is not None else "user"):
                return None  # nothing to answer (stopped, deleted or answered meanwhile)
            s = conv.settings
            backend, source = self.backend_of(s)
            params = SamplingParams(max_tokens=int(s.max_tokens), temperature=float(s.temperature), top_p=float(s.top_p),
                                    top_k=int(s.top_k) or -1, seed=s.seed, stop=list(s.stop),
                                    repetition_penalty=float(s.repetition_penalty))
            kwargs = {"enable_thinking": bool(s.thinking)} if source.supports_thinking else {}
            messages = engine_messages(replace(conv, messages=path), s)
            if continue_id is not None:
                kwargs["continue_final_message"] = True
                last = path[-1]
                request = GenerateRequest(params=params, messages=messages, chat_template_kwargs=kwargs)
                return Turn(request, last.id, text=last.content, earlier=last.stats, backend=backend, generate=source.generate)
            request = GenerateRequest(params=params, messages=messages, chat_template_kwargs=kwargs or None)
            question = path[-1]
            if question.stats is not None and question.stats.unanswered:  # answered now (↻): its mark goes
                self.store.update_message(question.id, question.content, replace(question.stats, unanswered=False).to_dict())
            reply = self.store.add_message(conv_id, question.id, "assistant", "", stats={"tokens": 0}, model=source.model_name)
            return Turn(request, reply.id, backend=backend, generate=source.generate, model_of=lambda: source.model_name)
        return make_turn

    def submit(self, tab: Tab, conv_id: int, request: gr.Request, make_turn, clicked_at: float | None = None) -> None:
        """Start (or queue) a reply of ``conv_id`` for this tab; stopped at once if the tab's Stop
        was clicked after it (``clicked_at``, browser ms) but handled before it."""
        self.replies.submit(conv_id, request.session_hash if request is not None else None, make_turn)
        if clicked_at is not None and tab.early_stop > clicked_at:
            tab.early_stop = 0.0
            self.replies.stop(conv_id)

    async def send(self, text: str, form: SettingsForm, clicked_at: float | None, request: gr.Request,
                   after_click: float | None = None):
        """Store the message (starting a chat if needed) and ask for its reply; a message sent
        while the chat replies is shown at once and answered next. Returns the answer for the
        message box (``draft_for_box``: the page emptied it at Enter; a message not sent goes
        back) and the status line: Generating as soon as the reply is asked for (``status_of``).
        ``after_click``: Enter came before the answer to a click that showed another chat
        (SEND_JS; 0: not), so the settings boxes sent are those of the chat shown before."""
        tab = self.tab(request)
        typed = text or ""
        kept, sent = self.draft_for_box(clicked_at, typed, None), self.draft_for_box(clicked_at, typed, "")
        # as typed: text taken from a message shown here other than by Copy (dragged, or pasted
        # with a middle click on Linux) brings the marks that show its HTML (view.shown_literally)
        text = typed_text(typed).strip()
        if clicked_at is not None and clicked_at <= tab.shown_since:
            self.keep_unsent(tab, text)  # sent from the chat shown before a click handled first
            return sent, gr.skip()  # (kept as that chat's draft, not put back here)
        if not text and (after_click or not tab.attachments):
            return sent, gr.skip()  # Enter on an empty box: nothing happens (nor after a click: not its files)
        sent_at = clicked_at if clicked_at is not None else time.time() * 1000
        last = tab.last_send
        # either order: Gradio may start the second send of a double click before the first
        if last is not None and last[:2] == (tab.conv_id, text) and abs(sent_at - last[2]) < DOUBLE_SEND_MS:
            return sent, gr.skip()  # the same message again at once: a double click or Enter, sent once
        conv = self.shown(tab)
        if not self.shows_current(tab, conv, appending=True):
            return kept, gr.skip()  # the message goes back to the box; the page shows the chat as it is now
        # the settings boxes as Enter found them, saved first; after a click whose answer had not
        # come (``after_click``), they were still those of the chat shown before: that chat's, not saved here
        checked = self.checked_form(form, self.settings_of(tab, conv))
        if not after_click and not self.save_settings(tab, *checked):
            return kept, gr.skip()  # the toast says which setting; the message goes back to the box
        if not self.backend_of(self.settings_in_force(tab))[1].ready:
            warn("The model is still loading; send your message once it has loaded (the status line stops saying Loading).")
            return kept, gr.skip()
        raw_text, text = text, with_attachments(text, tab.attachments)
        # A message sent to a chat that is not replying is answered on its own: the questions at
        # the chat's end that nothing answers (the chat stopped before their turn: Stop, a closed
        # tab, the app stopped) are marked as left unanswered, in the transaction that stores it,
        # so the model does not see them and they keep their mark (view.left_unanswered). Messages
        # sent while it replies are answered together by the reply after the last of them. (A
        # reply being stopped answers nothing more: ReplyManager.answers_later.)
        leave_unanswered = tab.conv_id is not None and not self.replies.answers_later(tab.conv_id)
        if tab.conv_id is None:  # the chat and its first message: one transaction, so a failure leaves no empty chat
            tab.conv_id = self.store.create(title=title_from(text), settings=tab.new_chat_settings, first_message=text).id
            tab.picked = True
            if tab.fields_shown is not None and tab.fields_shown[0] is None:  # the boxes show its settings: its title
                tab.fields_shown = (tab.conv_id, tab.fields_shown[1])       # box (empty) is redrawn, alone
        else:
            self.store.append(tab.conv_id, "user", text, leave_unanswered=leave_unanswered)
        tab.attachments = []  # sent with the message: only now (a failed store keeps them attached)
        tab.last_send = (tab.conv_id, raw_text, sent_at)
        tab.focus = None  # a message clicked above: the versions bar follows the new last turn
        self.submit(tab, tab.conv_id, request, self.turn_for(tab.conv_id), clicked_at)
        tab.status = self.status_of(tab)
        return sent, tab.status

    def keep_unsent(self, tab: Tab, text: str) -> None:
        """A message sent (Enter) just before a click that showed another chat, and reached by
        the server after that click: it was typed in the chat shown before (``tab.shown_before``),
        so it is neither sent into the chat shown now nor are its settings boxes saved there. Its
        text stays that chat's draft (``show`` kept its files there), and a toast says so."""
        chat = tab.shown_before
        if text:
            kept = tab.unsent.get(chat, "")
            if text not in kept:  # the click usually carried the box's text already (swap_draft)
                tab.unsent[chat] = f"{kept.rstrip()}\n\n{text}" if kept.strip() else text
        if not text and not tab.unsent_files.get(chat):
            return  # an empty box, no files: nothing was sent
        try:
            title = self.store.get(chat).title if chat is not None else "your new chat"
        except NotFoundError:
            tab.unsent.pop(chat, None)
            warn(f"Not sent: the chat it was typed in was deleted. Your message was: {text}" if text else
                 "Not sent: the chat it was typed in was deleted, and its files with it.")
            return
        warn(f"Not sent: you switched chats; your message is kept as the draft of «{title}».")

    async def regenerate(self, request: gr.Request):
        """↻: a new version of the last reply (the old one stays, ‹ › shows it again)."""
        tab = self.tab(request)
        conv = self.shown(tab)
        users = [m for m in conv.messages if m.role == "user"] if conv is not None else []
        if not self.shows_current(tab, conv):
            pass
        elif not users:
            warn("Nothing to regenerate yet.")
        elif self.replies.is_busy(conv.id):
            warn(BUSY_HINT)
        else:
            self.submit(tab, conv.id, request, self.turn_for(conv.id, after=users[-1].id))
        self.replies.notify()

    async def continue_reply(self, request: gr.Request):
        """Continue: the stopped or cut reply goes on where it ended (same message)."""
        tab = self.tab(request)
        conv = self.shown(tab)
        if not self.shows_current(tab, conv):
            return
        if not can_continue(conv):
            warn("Only a reply that was stopped or cut at max tokens can be continued.")
        elif self.replies.is_busy(conv.id):
            warn(BUSY_HINT)
        else:
            self.submit(tab, conv.id, request, self.turn_for(conv.id, continue_id=conv.messages[-1].id))

    async def edit(self, edit: gr.EditData, request: gr.Request, text: str | None = None):
        """✎ on any message makes a new version of it (the old one stays). An edited question is
        answered again; an edited reply is kept as you wrote it. Returns the title box (the chat's
        new title when the edit renamed it: ``retitle``) and the message box (``text``, the box's
        own): an edit refused because the chat changed elsewhere or is replying is put there,
        as ✎'s box is closed and the page shows the stored chat again (``kept_edit``)."""
        tab = self.tab(request)
        title = box = gr.skip()
        conv = self.shown(tab)
        shown = self.view_of(conv, tab)
        index = edit.index if isinstance(edit.index, int) else edit.index[0]
        item = shown[index] if conv is not None and 0 <= index < len(shown) else None
        new_text = edit_text(edit.value)
        if new_text == edit_text(edit.previous_value):
            pass  # unchanged (Gradio edits a reply and the line under it together: the line is no edit)
        elif not self.shows_current(tab, conv, note=EDIT_KEPT):
            box = kept_edit(text, new_text)  # the edit's index is into the chat as the tab showed it
        elif item is None or item.is_line or item.source is None:
            warn("Edit the message's own text, not the line above or under it.")
        elif self.replies.is_busy(conv.id):
            warn(f"{BUSY_HINT} {EDIT_KEPT}")
            box = kept_edit(text, new_text)
        elif not new_text:
            warn("A message cannot be empty.")
        elif new_text != item.source.content:
            target = item.source
            new = self.store.add_message(conv.id, target.parent_id, target.role, new_text)
            if self.retitle(tab, conv, target, new_text):
                title = title_from(new_text)
            later = len(conv.messages) - 1 - [m.id for m in conv.messages].index(target.id)
            # the versions bar acts on the new version; when messages leave the view with the
            # old one, its label says where they went (not a toast: it opened over the edited message)
            tab.focus, tab.bar_note = new.id, (new.id, branch_note(later)) if later else None
            if target.role == "user":
                self.submit(tab, conv.id, request, self.turn_for(conv.id))
        self.replies.notify()  # the view shows the stored chat again (Gradio changed it in place)
        return title, box

    def retitle(self, tab: Tab, conv, edited, new_text: str) -> bool:
        """A chat's title is made from its first message: when that message is edited (or another
        of its versions is shown: ‹ ›) and the title is still the one made from it (the user never
        renamed the chat), the title follows the new text. Whether it was renamed."""
        first = edited.role == "user" and edited.parent_id is None
        if not first or conv.title != title_from(edited.content) or conv.title == title_from(new_text):
            return False
        self.store.rename(conv.id, title_from(new_text))
        self.note_fields(tab, conv.id, title=title_from(new_text))  # the title box is sent it
        return True

    async def stop(self, clicked_at: float | None, request: gr.Request) -> None:
        """Stop the chat this tab shows: its reply ends, and a message sent while it replied stays
        in the chat unanswered (↻ answers it), as the user who pressed Stop expects; a message
        sent instead is answered on its own (``send``: the questions waiting are left unanswered)."""
        tab = self.tab(request)
        if not self.replies.stop(tab.conv_id) and clicked_at is not None:
            tab.early_stop = clicked_at  # a message clicked before it may not have arrived yet

    # ---- versions, one message

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
            warn(BUSY_HINT)
            return gr.skip()
        switched = self.store.switch_version(conv.id, target.id, step)
        tab.bar_note = None  # the earlier version it named is found
        depth = target.position
        tab.focus = next((m.id for m in switched.messages if m.position == depth), None)
        shown = switched.messages[depth] if depth < len(switched.messages) else None
        title = gr.skip()
        if shown is not None and shown.id != target.id and self.retitle(tab, conv, target, shown.content):
            title = title_from(shown.content)
        self.replies.notify()
        return title

    async def previous_version(self, request: gr.Request):
        return self.switch_version(-1, request)

    async def next_version(self, request: gr.Request):
        return self.switch_version(+1, request)

    async def delete_message(self, confirmed: bool, request: gr.Request):
        """Delete the message the versions bar acts on and what follows it; deleting a version of
        the first message retitles the chat as ✎ and ‹ › do (to the version shown after it)."""
        tab = self.tab(request)
        conv = self.shown(tab)
        if not confirmed or not self.shows_current(tab, conv):
            return gr.skip()
        target = focus_of(conv, tab.focus)
        if target is None:
            return gr.skip()
        if self.replies.is_busy(conv.id):
            warn(BUSY_HINT)
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

    # ---- the models panel

    async def list_models(self, pick: str | None = None):
        """The panel's list: the models the source offers, the one serving marked (and picked,
        unless ``pick`` names another that is listed)."""
        entries = await self.source.list_models()
        self.listed = {e.name: e for e in entries}
        return gr.update(choices=model_choices(entries),
                         value=pick if pick in self.listed else self.source.model_name)

    async def pull_model(self, model: str):
        """Pull: a hub id downloaded, or a .gguf file converted, by a child process while the
        current model keeps serving; its progress shows until it ends, then the list has the new
        model picked. A pull already under way (from any tab) is followed instead."""
        try:
            progress = await self.puller.start(model)
        except PullError as exc:
            progress = self.puller.progress if self.puller.busy else None
            yield f"⚠️ {markdown_literal(exc)}", gr.skip(), self.cancel_offered()
            if progress is None:
                return
            await asyncio.sleep(PULL_SHOW_S)
        async for line in self.pull_lines(progress):
            yield line, gr.skip(), self.cancel_offered()
        yield progress.line(), await self.list_models(pick=progress.name), self.cancel_offered()

    async def pull_lines(self, progress: PullProgress):
        """``progress`` as the page shows it, at most every PULL_SHOW_S, until the pull ends."""
        while not progress.over:
            yield progress.line()
            await asyncio.sleep(PULL_SHOW_S)
            await self.puller.wait_change(PULL_SHOW_S)

    def cancel_offered(self):
        """Cancel pull is pressable only while a pull runs (it looked pressable with none)."""
        return gr.update(interactive=self.puller.busy)

    async def cancel_pull(self):
        if not await self.puller.cancel():
            return "No pull is under way.", self.cancel_offered()
        return self.puller.progress.line(), gr.update(interactive=False)  # the pull's own event says when it ended

    def pull_status(self):
        """The pull under way, for a panel just opened (a reloaded tab), and whether it can be cancelled."""
        return self.puller.progress.line() if self.puller.busy else gr.skip(), self.cancel_offered()

    async def switch_model(self, name: str | None, request: gr.Request):
        """Switch: the model is checked while the current one serves; then every reply in flight
        stops (marked as stopped by the switch), and the page says it is loading until it is
        ready. A model that cannot be served leaves the current one serving, with the reason. The
        panel's message is Markdown: names and reasons in it are shown as typed (markdown_literal)."""
        if not name:
            yield "Pick a model in the list first.", gr.skip(), gr.skip()
            return
        if name not in self.listed:  # picked from a listing this page object has not made
            await self.list_models()
        backend = self.listed[name].backend if name in self.listed else None
        # what the same backend serves now
        current = next((e.name for e in self.listed.values() if e.serving and e.backend == backend), self.source.model_name)
        shown, shown_current = markdown_literal(name), markdown_literal(current)
        if name == current:
            yield f"**{shown}** is the model serving now.", gr.skip(), gr.skip()
            return
        yield f"Checking **{shown}**… ({shown_current} keeps serving)", gr.skip(), gr.skip()
        try:
            await self.source.check_model(name)
        except ModelError as exc:
            warn(f"{name} cannot be served: {exc}")
            yield (f"⚠️ **{shown}** cannot be served: {markdown_literal(exc)}. {shown_current} keeps serving.",
                   await self.list_models(), gr.skip())
            return
        self.replies.stop_every(f"switch to {name}", backend=backend)
        yield f"Loading **{shown}**… (the status line shows its progress)", gr.skip(), gr.skip()
        try:
            await self.source.switch_model(name)
        except ModelError as exc:
            warn(f"{name} could not be loaded.")
            message = f"⚠️ {markdown_literal(exc)}"
        else:
            message = f"Now serving **{shown}**."
        self.replies.notify()
        yield message, await self.list_models(), gr.update(visible=self.source.supports_thinking)

    # ---- import, search, attachments

    async def import_chat(self, path: str | None, clicked_at: float | None, request: gr.Request, text: str | None = None):
        """Import a chat file and show it. What was imported is said in a line under the Import
        button, not a toast: a toast opens over the top of the chat, where the imported chat's first
        message and its buttons are (it covered them for ten seconds). A refused file gets a
        toast (nothing was imported, and the reason must be seen); the message box's text, taken
        by the upload (LEAVE_CHAT_IMPORT_JS), is given back."""
        tab = self.tab(request)
        if not path:
            return (self.draft_for_box(clicked_at, text, None), *self.fields(tab), gr.skip(), gr.skip())
        try:
            file = self.uploads.take(path)
            try:
                if file.suffix.lower() != ".json":
                    raise BadImportFile(f"{file.name} is not a .json file; import {IMPORTABLE}")
                if file.stat().st_size > IMPORT_LIMIT_BYTES:
                    raise BadImportFile(f"the file is larger than {IMPORT_LIMIT_BYTES // 1_000_000} MB")
                data = file.read_bytes()
            finally:
                self.uploads.discard(str(file))  # read (or refused): its text is all the page keeps
            conv = self.store.import_conversation(data)
        except NotUploaded as exc:
            warn(f"Not imported: {exc}.")
            return (self.draft_for_box(clicked_at, text, None), *self.fields(tab), gr.skip(), "")
        except BadImportFile as exc:
            warn(f"Not imported: {exc}")
            return (self.draft_for_box(clicked_at, text, None), *self.fields(tab), gr.skip(), "")
        tab.search = ""  # the imported chat is listed
        box = self.show(tab, conv.id, clicked_at, text)
        count = len(conv.messages)
        shown = f"{count:,} {plural('message', count)}" + (f"; the last {WINDOW} shown" if count > WINDOW else " shown")
        return (box, *self.fields(tab), "", f"Imported “{markdown_literal(conv.title)}” ({shown}).")

    async def search(self, query: str, request: gr.Request):
        tab = self.tab(request)
        tab.search = (query or "").strip()
        tab.sidebar = self.render_sidebar(tab)
        return as_update("sidebar", tab.sidebar)

    async def attach(self, paths: list[str] | None, request: gr.Request):
        """Text files go into the next message, each under its name: several may be picked at once
        (the file chooser took one, and each file was a trip of its own to it); the same file (name
        and text) attached again goes in once, and a toast says so."""
        tab = self.tab(request)
        if not paths:
            return gr.skip()
        for path in paths:
            try:
                uploaded = self.uploads.take(path)
            except NotUploaded as exc:
                warn(f"Not attached: {exc}.")
                continue
            file = readable_attachment(uploaded)
            self.uploads.discard(str(uploaded))  # read (or refused): its text is kept in the tab
            if file is None:
                continue
            if file in tab.attachments:  # the same file again: it goes into the message once
                inform(f"{file[0]} is already attached: it goes into your message once.")
            else:
                tab.attachments.append(file)
        return await self.attachments_note(request)

    async def unattach(self, request: gr.Request):
        """✕ Remove attachments: the files attached are not sent after all."""
        self.tab(request).attachments = []
        return await self.attachments_note(request)

    async def attachments_note(self, request: gr.Request):
        """The line naming the files attached to the next message, and ✕ to remove them (shown
        only while there are some)."""
        attachments = self.tab(request).attachments
        return attachments_line(attachments), gr.update(visible=bool(attachments))

    # ---- layout

    def build(self) -> gr.Blocks:
        """The page: a sidebar (chats, settings, models) beside the chat, then its events."""
        with gr.Blocks(title="minisgl-chat", fill_height=True) as demo:
            with gr.Row(equal_height=False):
                with gr.Column(scale=1, min_width=220, elem_id="sidebar"):
                    # on a phone the sidebar is a bar above the chat: ☰ Chats opens the rest (PAGE_JS, page_css.NARROW)
                    with gr.Row(elem_id="sidebar-bar"):
                        gr.Button("☰ Chats", elem_id="chats-toggle", scale=0, min_width=110)
                        new_btn = gr.Button("＋ New chat", elem_id="new-chat-btn", variant="secondary")
                    with gr.Column(elem_id="sidebar-body"):
                        chats = self._chats_panel(new_btn)
                        with gr.Accordion("Settings", open=False, elem_id="settings"):
                            settings = self._settings_panel()
                        with gr.Accordion("Models", open=False, elem_id="models") as models_box:
                            models = self._models_panel()
                            models.box = models_box
                # the sidebar a quarter of the row (~300 px at 1280): at a fifth (238 px) a chat's title showed ~14 letters
                with gr.Column(scale=3, elem_id="main"):
                    main = self._chat_column()
            self._wire(demo, chats, settings, models, main)
        self.uploads.stored = getattr(demo, "upload_file_set", set())  # filled by Gradio's upload route
        check_uploads_as_launched(demo)
        return demo

    def _chats_panel(self, new_btn: gr.Button) -> SimpleNamespace:
        search = gr.Textbox(show_label=False, label="Search chats", placeholder="Search chats", elem_id="search",
                            max_lines=1)
        conv_list = gr.Radio(choices=[], label="Conversations", elem_id="conv-list", interactive=True)
        with gr.Accordion("Manage", open=False, elem_id="manage"):
            # shown once the chat is stored (ChatPage.render: the page's load renders it for a stored chat)
            with gr.Column(elem_id="chat-actions", visible=False) as actions:
                title_box = gr.Textbox(label="Title", elem_id="title-input", max_lines=1)
                rename_btn = gr.Button("Rename", elem_id="rename-btn", size="sm")
                delete_btn = gr.Button("Delete chat", elem_id="delete-btn", size="sm", variant="stop")
                export_md = gr.Button("Export Markdown", elem_id="export-md-btn", size="sm")
                export_json = gr.Button("Export JSON", elem_id="export-json-btn", size="sm")
            no_actions = gr.Markdown(NO_CHAT_ACTIONS, elem_id="no-chat-actions", visible=False)
            import_btn = gr.UploadButton("Import chat (JSON)", elem_id="import-btn", size="sm")  # any file: see IMPORTABLE
            import_note = gr.Markdown("", elem_id="import-note")  # what the last import brought in
            export_file = gr.File(elem_id="export-file", visible="hidden", interactive=False)
            confirmed = gr.Checkbox(visible="hidden", elem_id="confirmed")
            clicked_at = gr.Number(visible="hidden", elem_id="clicked-at")  # STAMP_JS fills it
            after_click = gr.Number(visible="hidden", elem_id="after-click")  # SEND_JS fills it
            shown_draft = gr.Textbox(visible="hidden", elem_id="shown-draft")  # ChatPage.draft_for_box: APPLY_DRAFT_JS reads it
            fields_redrawn = gr.Textbox(visible="hidden", elem_id="fields-redrawn")  # ChatPage.redraw_boxes: APPLY_REDRAWN_FIELDS_JS reads it
            in_address = gr.Number(visible="hidden", elem_id="chat-in-address")  # ASKED_CHATS_JS fills them
            remembered = gr.Number(visible="hidden", elem_id="chat-remembered")
        return SimpleNamespace(new_btn=new_btn, search=search, conv_list=conv_list, actions=actions, no_actions=no_actions,
                               title_box=title_box, rename_btn=rename_btn, delete_btn=delete_btn, export_md=export_md,
                               export_json=export_json, import_btn=import_btn, import_note=import_note, export_file=export_file,
                               confirmed=confirmed, clicked_at=clicked_at, after_click=after_click, shown_draft=shown_draft,
                               fields_redrawn=fields_redrawn, in_address=in_address, remembered=remembered)

    def _settings_panel(self) -> SimpleNamespace:
        """The chat's settings, in SETTING_FIELDS' order (``fields``)."""
        d = self.store.default_settings()
        backends = self.source.backends
        # shown when the app has a local engine and a remote (--remote URL --local)
        backend = gr.Radio(choices=[(source.label, name) for name, source in backends.items()], value=next(iter(backends)),
                           label="Replies from (this chat)", elem_id="backend", visible=len(backends) > 1, interactive=True)
        system_box = gr.Textbox(label="System prompt", value=d.system_prompt, lines=3, elem_id="system-prompt")
        temperature = gr.Slider(0, 2, value=d.temperature, step=0.05, label="Temperature (0 = greedy)",
                                elem_id="temperature")
        top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="Top-p", elem_id="top-p")
        # no precision=0: Gradio would round a typed 2.5 before form_settings sees it, and save
        # 2 while the box shows 2.5; form_settings refuses a fraction with a sentence instead
        max_tokens = gr.Number(label="Max tokens", value=d.max_tokens, step=1, elem_id="max-tokens")
        repetition_penalty = gr.Slider(1, REPETITION_PENALTY_MAX, value=d.repetition_penalty, step=0.01,
                                       label="Repetition penalty (1 = off)", elem_id="repetition-penalty",
                                       info="Higher: the model repeats itself less (small models loop without one)")
        thinking = gr.Checkbox(label="Thinking mode", value=d.thinking, visible=False, elem_id="thinking")
        top_k = gr.Number(label="Top-k (0 = off)", value=d.top_k, step=1, elem_id="top-k")
        seed = gr.Number(label="Seed (empty = random)", value=d.seed, step=1, elem_id="seed")
        stop = gr.Textbox(label="Stop strings (one per line)", value="", lines=2, elem_id="stop-strings")
        gr.Markdown("Settings apply to this chat once you leave a box (or press Enter) or let go of a slider.", elem_classes="hint")
        # the form's order is SETTING_FIELDS'; the penalty shows beside the other sampling settings
        fields = [system_box, temperature, top_p, max_tokens, thinking, top_k, seed, stop, repetition_penalty]
        return SimpleNamespace(fields=fields, boxes=dict(zip(SETTING_FIELDS, fields)), thinking=thinking, backend=backend)

    def _models_panel(self) -> SimpleNamespace:
        model_list = gr.Radio(choices=[], label="Pick one, then Switch", elem_id="model-list", interactive=True)
        with gr.Row():
            switch_btn = gr.Button("Switch", elem_id="switch-model-btn", size="sm", variant="primary")
            refresh_btn = gr.Button("Refresh", elem_id="refresh-models-btn", size="sm")
        model_message = gr.Markdown("", elem_id="model-message")
        pull = None
        if self.puller is not None:
            pull_box = gr.Textbox(label="Pull a model", placeholder="Qwen/Qwen3-0.6B or /path/to/model.gguf", elem_id="pull-input",
                                  info="A Hugging Face id (downloaded to its cache) or a .gguf file (converted once)")
            with gr.Row():
                pull_btn = gr.Button("Pull", elem_id="pull-btn", size="sm")
                cancel_btn = gr.Button("Cancel pull", elem_id="cancel-pull-btn", size="sm", interactive=False)  # while a pull runs
            pull = SimpleNamespace(box=pull_box, pull_btn=pull_btn, cancel_btn=cancel_btn,
                                   message=gr.Markdown("", elem_id="pull-message"))
        return SimpleNamespace(model_list=model_list, switch_btn=switch_btn, refresh_btn=refresh_btn,
                               model_message=model_message, pull=pull)

    def _chat_column(self) -> SimpleNamespace:
        # the page's first render, until its load is answered: the app's line at build time
        # ("Starting… 0/3") would be stale by then
        status = gr.Markdown("Connecting…", elem_id="status-line")
        chatbot = gr.Chatbot(
            elem_id="chatbot", show_label=False, height="70vh", editable="all",
            # one bubble per message: Copy copies one message (not the reply with its stats line)
            group_consecutive_messages=False,
            buttons=["copy"], feedback_options=None,
            placeholder="Ask anything. Replies stream in; **Stop** (or Escape) ends one at once.",
        )
        # Continue floats over the chat's bottom right corner, under the reply it extends
        # (page_css.CONTINUE_FLOATS): a fourth button in the composer's row squeezed the message box
        with gr.Row(elem_id="continue-anchor"):
            continue_btn = gr.Button("Continue", elem_id="continue-btn", size="sm", scale=0, min_width=90, visible=False)
        with gr.Row(elem_id="versions", visible=False) as versions:
            prev_btn = gr.Button("‹", elem_id="prev-version-btn", size="sm", min_width=40, scale=0)
            versions_text = gr.Markdown("", elem_id="versions-label")
            next_btn = gr.Button("›", elem_id="next-version-btn", size="sm", min_width=40, scale=0)
            delete_msg_btn = gr.Button("Delete message", elem_id="delete-message-btn", size="sm", scale=0,
                                       min_width=120)
        with gr.Row(elem_id="composer"):
            attach_btn = gr.UploadButton("Attach", elem_id="attach-btn", size="sm", scale=0, min_width=70,
                                         file_count="multiple")  # any text files, several at once
            msg = gr.Textbox(label="Message", show_label=False, elem_id="msg-input", scale=8, lines=1, max_lines=8,
                             autofocus=True, placeholder="Message (Enter sends, Shift+Enter for a new line)")
            send_btn = gr.Button("Send", elem_id="send-btn", variant="primary", scale=1, min_width=80)
            stop_btn = gr.Button("Stop", elem_id="stop-btn", variant="secondary", scale=1, min_width=80)
        with gr.Row(elem_id="attached-row"):
            attached = gr.Markdown("", elem_id="attached")
            unattach_btn = gr.Button("✕ Remove attachments", elem_id="remove-attachments-btn", size="sm", scale=0, min_width=170,
                                     visible=False)  # shown while files wait for the next message
        editing = gr.Checkbox(visible="hidden", elem_id="editing")  # EDITING_JS fills it for the tick
        # the tick changes them to have the chat redrawn, and its title and settings boxes
        redraw_chat = gr.Number(0, visible="hidden", elem_id="redraw-chat")
        refresh = gr.Number(0, visible="hidden", elem_id="refresh")
        focused = gr.Textbox(visible="hidden", elem_id="focused-field")  # FOCUSED_FIELD_JS fills it for the redraw
        return SimpleNamespace(status=status, chatbot=chatbot, versions=versions, prev_btn=prev_btn,
                               versions_text=versions_text, next_btn=next_btn, delete_msg_btn=delete_msg_btn,
                               attach_btn=attach_btn, msg=msg, send_btn=send_btn, stop_btn=stop_btn,
                               continue_btn=continue_btn, attached=attached, unattach_btn=unattach_btn, editing=editing,
                               redraw_chat=redraw_chat, refresh=refresh, focused=focused)

    def _wire(self, demo: gr.Blocks, chats: SimpleNamespace, settings_panel: SimpleNamespace, models: SimpleNamespace,
              main: SimpleNamespace) -> None:
        """Every event of the page: what each control calls, and the follow that renders after it."""
        c, m = chats, main
        settings = settings_panel.fields
        tab_fields = [c.title_box, *settings, settings_panel.backend]
        # queued (toasts need the queue) but never waiting behind one another; and never
        # dropped: Gradio's default trigger_mode "once" ignores an event while its previous run
        # is pending, so a message sent (or a follow started) while the last one still ran
        # was lost, and the page kept showing a stale chat
        quick = dict(show_progress="hidden", concurrency_limit=None, trigger_mode="multiple")

        view = [m.chatbot, m.status, c.conv_list, m.versions, m.versions_text, m.continue_btn, m.stop_btn, m.prev_btn, m.next_btn,
                c.actions, c.no_actions]
        follow = dict(fn=self.follow, outputs=view, show_progress="hidden", concurrency_limit=None, trigger_mode="multiple")
        timer = gr.Timer(IDLE_CHECK_S)

        loaded = demo.load(self.load_page, inputs=[c.in_address, c.remembered], outputs=[*tab_fields, settings_panel.thinking],
                           js=ASKED_CHATS_JS, **quick)
        # the chat shown, whoever chose it (a click, the load, a delete, a first message), goes to the address
        c.conv_list.change(None, inputs=c.conv_list, js=REMEMBER_SHOWN_CHAT_JS, **quick)
        loaded.then(**follow)
        loaded.then(None, js=MARK_LOADED_JS)
        # the list's value may not change at the load (the chat asked for was gone): the address names the chat shown
        loaded.then(None, inputs=c.conv_list, js=REMEMBER_SHOWN_CHAT_JS, **quick)
        self._wire_models(models, settings_panel.thinking, quick)
        demo.unload(self.unload)
        # The tick is queued, so that the tab's event stream opens at least once a second: Gradio
        # (6.31) closes a tab's stream when its last queued event ends, and an event accepted
        # while the browser has not yet seen that close has its messages (a render, a toast)
        # held on the server until a later queued event opens a stream (seen in CI: a refused
        # setting's toast and a New chat's render never shown). Not an event as long as the
        # tab instead: with Gradio's heartbeat that holds two of the browser's six connections
        # to the server per tab, and a fourth tab never loaded. trigger_mode "multiple": a tick so
        # held (it was the event accepted in that moment) stopped every later tick under Gradio's
        # default ("once": no new run while one is pending), and with them the stream that brings
        # held messages: the page stood still until the person did something. A tick does not
        # await, so two never overlap on the server.
        # show_progress_on: a tick must not mark the chat as pending (Gradio shows a pending bubble)
        timer.tick(self.tick, inputs=m.editing, outputs=[*view, m.redraw_chat, m.refresh], js=EDITING_JS,
                   show_progress="hidden", show_progress_on=[m.status], concurrency_limit=None, trigger_mode="multiple")
        m.redraw_chat.change(**follow)  # the tick saw the chat changed elsewhere: redraw it
        # its title and settings boxes behind: redrawn through a hidden box, as a box changed by
        # the user since the redraw was asked keeps what the user put there
        redraw = m.refresh.change(self.redraw_boxes, inputs=[m.refresh, m.focused], outputs=c.fields_redrawn,
                                  js=FOCUSED_FIELD_JS, **quick)
        redraw.then(None, inputs=c.fields_redrawn, outputs=[*tab_fields, c.fields_redrawn], js=APPLY_REDRAWN_FIELDS_JS, **quick)
        # stamped (STAMP_JS): a settings box these clicks leave is saved to the chat shown before
        attachments = dict(fn=self.attachments_note, outputs=[m.attached, m.unattach_btn], **quick)

        def then_redraw(event, draft: bool = False) -> None:
            """After an event that may show another chat (or send the files attached): the chat,
            and the attachment note (the files attached are those kept for the chat shown); with
            ``draft``, the message box the event took: what its answer gives back (the draft of
            the chat shown, a message not sent) before what was typed since (APPLY_DRAFT_JS)."""
            if draft:
                event.then(None, inputs=c.shown_draft, js=APPLY_DRAFT_JS, **quick)
                event.failure(None, js=RESTORE_DRAFT_JS, **quick)
            event.then(**follow)
            event.then(**attachments)

        # each of these shows another chat: the message box's text stays with the chat left, and
        # the box shows the draft of the chat shown (ChatPage.swap_draft, LEAVE_CHAT_*_JS)
        shown_fields = [c.shown_draft, *tab_fields]
        with_form = self._form_handlers(c, m, settings_panel.boxes)
        then_redraw(c.new_btn.click(with_form.new_chat, inputs={c.clicked_at, m.msg, *settings}, outputs=shown_fields,
                                    js=LEAVE_CHAT_NEW_JS, **quick), draft=True)
        then_redraw(c.conv_list.input(self.select, inputs=[c.conv_list, c.clicked_at, m.msg], outputs=shown_fields,
                                      js=LEAVE_CHAT_SELECT_JS, **quick), draft=True)
        # .change, not .input: Gradio's Textbox sends .input on key presses only (not on
        # Backspace, cut or paste); the box is never an output, so only the user changes it
        c.search.change(self.search, inputs=c.search, outputs=c.conv_list, **quick)
        c.rename_btn.click(self.rename, inputs=c.title_box, outputs=[c.conv_list, c.title_box], **quick)
        c.title_box.submit(self.rename, inputs=c.title_box, outputs=[c.conv_list, c.title_box], **quick)
        then_redraw(c.delete_btn.click(self.delete, inputs=[c.confirmed, c.clicked_at, m.msg], outputs=shown_fields,
                                       js=CONFIRM_DELETE_CHAT_JS, **quick), draft=True)
        for button, handler in ((c.export_md, self.export_md), (c.export_json, self.export_json)):
            button.click(handler, outputs=c.export_file, **quick).success(None, js=CLICK_DOWNLOAD_JS)
        then_redraw(c.import_btn.upload(self.import_chat, inputs=[c.import_btn, c.clicked_at, m.msg],
                                        outputs=[*shown_fields, c.search, c.import_note], js=LEAVE_CHAT_IMPORT_JS, **quick), draft=True)
        for item in settings:  # saved when committed, not on every key: a box when left (PAGE_JS: or on Enter), a slider let go
            committed = item.release if isinstance(item, gr.Slider) else item.input if isinstance(item, gr.Checkbox) else item.blur
            committed(with_form.settings_changed, inputs={*settings, c.clicked_at}, outputs=settings, js=STAMP_JS, **quick)
        settings_panel.backend.input(self.backend_changed, inputs=settings_panel.backend, **quick).then(**follow)
        for trigger in (m.msg.submit, m.send_btn.click):
            then_redraw(trigger(with_form.send, inputs={m.msg, *settings, c.clicked_at, c.after_click}, outputs=[c.shown_draft, m.status],
                                js=SEND_JS, **quick), draft=True)
        m.msg.change(None, js=SYNC_SEND_JS)
        m.attach_btn.upload(self.attach, inputs=m.attach_btn, outputs=[m.attached, m.unattach_btn], **quick)
        m.unattach_btn.click(self.unattach, outputs=[m.attached, m.unattach_btn], **quick)
        m.chatbot.retry(self.regenerate, **quick).then(**follow)
        m.chatbot.edit(self.edit, inputs=m.msg, outputs=[c.title_box, m.msg], **quick).then(**follow)
        m.chatbot.select(self.focus, **quick).then(**follow)
        m.prev_btn.click(self.previous_version, outputs=c.title_box, **quick).then(**follow)
        m.next_btn.click(self.next_version, outputs=c.title_box, **quick).then(**follow)
        m.delete_msg_btn.click(self.delete_message, inputs=c.confirmed, outputs=c.title_box,
                               js=confirm_js("Delete this message and what follows it?"), **quick).then(**follow)
        m.continue_btn.click(self.continue_reply, **quick).then(**follow)
        m.stop_btn.click(self.stop, inputs=c.clicked_at, js=STAMP_JS, **quick)

    def _form_handlers(self, chats: SimpleNamespace, main: SimpleNamespace, boxes: dict[str, gr.components.Component]
                       ) -> SimpleNamespace:
        """New chat, a settings box's save and Send as the page calls them: Gradio gives a handler
        whose inputs are a set one dict of their values by component; the settings boxes' values
        become one SettingsForm."""
        def form_of(values: dict) -> SettingsForm:
            return SettingsForm(**{name: values[box] for name, box in boxes.items()})

        async def new_chat(values: dict, request: gr.Request):
            return await self.new_chat(values[chats.clicked_at], request, values[main.msg], form_of(values))

        async def settings_changed(values: dict, request: gr.Request) -> tuple:
            return await self.settings_changed(form_of(values), values[chats.clicked_at], request)

        async def send(values: dict, request: gr.Request):
            return await self.send(values[main.msg], form_of(values), values[chats.clicked_at], request, values[chats.after_click])

        return SimpleNamespace(new_chat=new_chat, settings_changed=settings_changed, send=send)

    def _wire_models(self, models: SimpleNamespace, thinking: gr.Checkbox, quick: dict) -> None:
        """The models panel's events: list, switch, and pull when this app can pull."""
        for trigger in (models.box.expand, models.refresh_btn.click):
            trigger(self.list_models, outputs=models.model_list, **quick)
        models.switch_btn.click(self.switch_model, inputs=models.model_list,
                                outputs=[models.model_message, models.model_list, thinking], **quick)
        if models.pull is not None:
            for trigger in (models.pull.pull_btn.click, models.pull.box.submit):
                trigger(self.pull_model, inputs=models.pull.box, outputs=[models.pull.message, models.model_list, models.pull.cancel_btn],
                        **quick)
            models.pull.cancel_btn.click(self.cancel_pull, outputs=[models.pull.message, models.pull.cancel_btn], **quick)
            models.box.expand(self.pull_status, outputs=[models.pull.message, models.pull.cancel_btn], **quick)


def build_ui(source: ReplySource, store: ConversationStore, puller: ModelPuller | None = None) -> gr.Blocks:
    """The whole page, its replies written by ``source`` (reply_source.py), with a Pull in
    its models panel when given a ``puller``."""
    let_sliders_take_typed_values()
    return ChatPage(source, store, puller).build()


def edit_text(value) -> str:
    """The text of an edited message as Gradio sends it (a string, or a list of text parts), as
    the user typed it (without the marks that show its HTML as text: view.shown_literally)."""
    if isinstance(value, list):
        return "".join(edit_text(v) for v in value)
    if isinstance(value, dict):
        return typed_text(str(value.get("text") or value.get("content") or ""))
    return typed_text("" if value is None else str(value)).strip()


def kept_edit(box: str | None, edited: str):
    """The message box holding a refused edit's text: after what the box held (a draft is kept),
    or alone; nothing to keep for an empty edit."""
    if not edited:
        return gr.skip()
    return f"{box.rstrip()}\n\n{edited}" if box and box.strip() else edited


TITLE_LIMIT = 200  # characters of a chat's title that Rename keeps


def warn(message: str) -> None:
    """A warning toast (``gr.Warning``) that shows ``message`` as text: Gradio draws a toast's
    message as HTML, and messages quote what the user gave (a chat's title, a file name)."""
    gr.Warning(html.escape(message, quote=False))


def inform(message: str) -> None:
    """An information toast (``gr.Info``), shown as text like :func:`warn`'s."""
    gr.Info(html.escape(message, quote=False))


def branch_note(later: int) -> str:
    """What the versions bar says after an edit of a message with ``later`` messages after it
    (the bar acts on the new version): the chat now shows the new version alone, and the old one
    with its continuation is still there."""
    after = "the message after it" if later == 1 else f"the {later} messages after it"
    return f"new branch: the earlier version and {after} are kept (‹ shows them)"


# A word of an export's file name: letters and digits of any script, with the "-", "_", "." or
# "'" inside it kept (gpt-4, my_notes, v1.2, don't)
_NAME_WORD = re.compile(r"[^\W_]+(?:[-_.'][^\W_]+)*")
EXPORT_NAME_LENGTH = 80


# A pair of HTML tags around text ("<b>Plan</b>") is markup: its text stays, the tags' name goes (it
# made "b Plan b"); a tag alone ("what does the <div> tag do") is what the title is about
_TAG_PAIR = re.compile(r"<([A-Za-z][A-Za-z0-9]*)\b[^<>]*>(.*?)</\1\s*>", re.S)


def export_stem(title: str) -> str:
    """An exported chat's file name, without its extension: the readable words of its title, one
    space between them ("**Plan** 🚀" is "Plan"; markup, emoji and punctuation are left out, where
    each became a "_"), cut at a word within EXPORT_NAME_LENGTH; "chat" when no word is left."""
    pairs_taken_out = 1
    while pairs_taken_out:  # from the outside in: "<b><i>x</i></b>"
        title, pairs_taken_out = _TAG_PAIR.subn(r" \2 ", title)
    stem = ""
    for word in _NAME_WORD.findall(title):
        longer = f"{stem} {word}" if stem else word
        if len(longer) > EXPORT_NAME_LENGTH:
            stem = stem or word[:EXPORT_NAME_LENGTH]
            break
        stem = longer
    return stem or "chat"


def with_attachments(text: str, attachments: list[tuple[str, str]]) -> str:
    """The message with each attached file after it, under its name, in a fenced block."""
    parts = [text] if text else []
    for name, body in attachments:
        fence = "````" if "```" in body else "```"
        parts.append(f"**{name}**\n{fence}\n{body.rstrip()}\n{fence}")
    return "\n\n".join(parts)


def readable_attachment(file: Path) -> tuple[str, str] | None:
    """A file to attach as (its name, its text); None, with a warning naming it, for a file that is
    not UTF-8 text or is larger than ATTACH_LIMIT_BYTES."""
    name = file.name
    try:
        if file.stat().st_size > ATTACH_LIMIT_BYTES:
            raise ValueError(f"{name} is larger than 1 MB")
        text = file.read_bytes().decode("utf-8")
        if "\x00" in text:
            raise ValueError(f"{name} is not a text file")
    except UnicodeDecodeError:
        warn(f"Not attached: {name} is not UTF-8 text.")
        return None
    except ValueError as exc:
        warn(f"Not attached: {exc}.")
        return None
    return name, text


def attachments_line(attachments: list[tuple[str, str]]) -> str:
    if not attachments:
        return ""
    files = (f"`{name}` ({len(body):,} {plural('character', len(body))})" for name, body in attachments)
    return "Attached to your next message: " + ", ".join(files)
