"""What each browser tab shows (:class:`Tab`), and :class:`TabState`, the part of ChatPage that
finds a tab's state and reads the chat it shows: the base of every panel's handlers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from ..chat.attachment_fit import TooLong
from ..chat.live import ReplyManager
from ..chat.reply_source import ReplySource
from ..chat.settings_form import SettingsForm
from ..chat.store import ChatSettings, ConversationStore, NotFoundError
from ..chat.uploads import Uploads
from ..chat.view import WINDOW
from . import toasts
from .page_view import Sidebar

BUSY_HINT = "This chat is replying: press Stop (or Escape) first."
# Several tabs may show one chat. An action on what a tab shows is refused when the chat changed
# since (TabState.shows_current); an idle tab redraws a chat changed elsewhere (Ticks.tick).
CHANGED_ELSEWHERE = (
    "This chat changed in another tab — it has been reloaded. Look it over, then try again."
)
SEND_CHANGED_ELSEWHERE = (
    "This chat changed in another tab — it has been reloaded. Your message is still in the box: "
    "send it again to add it to the chat as it is now."
)
# A tab none of whose events came for this long is taken as closed (TabState.close_silent_tabs):
# a tab ticks every second, a hidden one at least once a minute (Chromium throttles the timers of
# hidden tabs to that), so only a tab that went without a word (its browser crashed, or froze it)
# is this silent.
TAB_SILENT_S = 180.0
# How long the files attached in a tab that closed wait for a page of its browser tab (a reload
# comes back within seconds; a tab closed for good never does)
LEFT_FILES_S = 600.0
DELETED_ELSEWHERE = "This chat was deleted in another tab."
SEND_DELETED_ELSEWHERE = (
    DELETED_ELSEWHERE
    + " Your message is still in the box: send it again to start a new chat with it."
)


@dataclass(frozen=True)
class Seen:
    """What a tab's last render showed: the chat, its messages (ids, in order) and its revision
    (the store's write count) then."""

    conv_id: int | None
    path: tuple[int, ...] = ()
    revision: int | None = None


@dataclass
class Follows:
    """The tab's follow events (ViewEvents.follow): which one renders it now, and when one ended."""

    follower: int = 0  # which follow event renders the tab now
    following: asyncio.Event | None = None  # set when the tab's latest follow event has ended
    ended_at: float = 0.0  # when (monotonic s) a follow of the tab last ended
    recheck_at: float | None = None  # when the tick sends the whole view once more (monotonic s)


@dataclass
class Drawn:
    """What the tab's renders last sent the browser: the tick sends only what changed since, and
    an action on the chat is refused when the chat changed since the tab drew it."""

    seen: Seen | None = None  # what the tab's last render showed
    sidebar: Sidebar | None = None  # the sidebar as last sent
    status: str | None = None  # the status line as last sent
    # the chat whose title and settings the page's boxes show, and their values (FIELD_IDS' order)
    # as this tab last sent or saved them: a redraw sends only the boxes changed elsewhere since
    fields_shown: tuple[int | None, tuple] | None = None
    # the tick's counts of redraws asked for: of the chat (a change of it starts a follow) and of
    # its title and settings boxes (a change of it starts redraw_boxes)
    chat_redraws: int = 0
    refreshes: int = 0


@dataclass
class Meter:
    """The line under the message box (reply_request.meter_text): the box's text as its last
    change sent it, and the line last drawn with what it counted (``key``), so a render counts
    again only when the chat, its settings or the text changed."""

    typed: str = ""
    key: tuple | None = None
    text: str = ""


@dataclass
class Draft:
    """What the tab is writing: the files attached to its next message, and what it left unsent
    in each chat, put back when the tab shows that chat again (Drafts.swap_draft)."""

    attachments: list[tuple[str, str]] = field(
        default_factory=list
    )  # (file name, text) for the next message
    unsent: dict[int | None, str] = field(default_factory=dict)  # by chat (None: its new chat)
    unsent_files: dict[int | None, list[tuple[str, str]]] = field(
        default_factory=dict
    )  # and the files attached there
    # the last message sent: (chat, text, browser time in ms of its click or Enter), to drop the
    # second send of a double click or a double Enter (the box empties only when the first is done)
    last_send: tuple[int, str, float] | None = None
    # the files attached make the message too long for the model: the page says so and offers
    # to send their first part (``too_long.cut``) or cancel (attachments.py); None: no notice
    too_long: TooLong | None = None


@dataclass
class LeftFiles:
    """The files attached in a tab that closed, by chat (None: its new chat), and when it closed
    (monotonic s)."""

    files: dict[int | None, list[tuple[str, str]]]
    at: float


@dataclass
class Events:
    """What the tab's events leave for the next ones, which Gradio may run in another order than
    the clicks that made them: browser times (ms) of clicks and saves, and the last save refused."""

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
    early_stop: float = 0.0  # browser time (ms) of the tab's last Stop that found no reply to stop


@dataclass
class Tab:
    """What one browser tab shows: a conversation, or (None) a new chat not stored yet, with
    the settings it will start with; and, in parts, how the tab's events and renders went."""

    conv_id: int | None = None
    browser_tab: str | None = None  # the key its browser tab keeps across reloads (claim_files)
    new_chat_settings: ChatSettings | None = (
        None  # the settings its new chat (conv_id None) starts with
    )
    picked: bool = False  # the user has chosen what the tab shows (the page's load keeps it then)
    lost: bool = False  # the chat it showed was found deleted (by another tab): not said yet
    focus: int | None = None  # the message the versions bar acts on (None: view.focus_of's choice)
    # (message, note) the versions bar adds to its label while it acts on that message: where the
    # messages after an edited one went (MessageEdits.edit; a toast there would cover the edited message)
    bar_note: tuple[int, str] | None = None
    search: str = ""  # what the sidebar is filtered by
    window: int = (
        WINDOW  # how many of the shown chat's last messages the chat shows (view.windowed)
    )
    follows: Follows = field(default_factory=Follows)
    drawn: Drawn = field(default_factory=Drawn)
    draft: Draft = field(default_factory=Draft)
    events: Events = field(default_factory=Events)
    meter: Meter = field(default_factory=Meter)
    seen_at: float = field(default_factory=time.monotonic)  # when an event of the tab last came


class TabState:
    """The tabs' state and what every panel reads of it: the chat a tab shows, whether the tab's
    render of it is current, its settings and where its replies come from."""

    source: ReplySource  # where replies come from: the local engine or a remote server
    store: ConversationStore
    replies: ReplyManager
    tabs: dict[str, Tab]
    left_files: dict[str, LeftFiles]  # by the browser tab a closed tab was (Tab.browser_tab)
    uploads: Uploads

    def tab(self, request: gr.Request | None) -> Tab:
        """The tab of the request's session, made at its first event. Not again for a tab whose
        page said it went (ReplyManager.gone): an event it sent just before its beacon and
        answered after it (its tick) acts on a Tab kept nowhere; it brought the closed tab back,
        which then lived until its silence closed it again (TAB_SILENT_S)."""
        key = request.session_hash if request is not None and request.session_hash else "-"
        tab = self.tabs.get(key)
        if tab is None:
            tab = Tab(new_chat_settings=self.store.default_settings())
            if key not in self.replies.gone:
                self.tabs[key] = tab
        tab.seen_at = time.monotonic()
        return tab

    def tab_closed(self, session: str, said: bool = True) -> None:
        """The tab of ``session`` is gone: its replies stop unless a page shows them again soon
        (ReplyManager.page_gone), and its state goes. A page says so as it goes (``said``: its
        beacon, mount.TabClosedBeacon), for good: an event it sent just before may be answered
        after the beacon, and must not bring it back. One that went without a word is found by
        its silence (close_silent_tabs). Not Gradio's unload event: the heartbeat stream it needs
        held one of the browser's six connections to the app for as long as the tab was open.
        The files attached in it, by chat, wait a while for a page of the same browser tab
        (``claim_files``): a reload is a new tab, and they were lost."""
        self.replies.page_gone(session, for_good=said)
        tab = self.tabs.pop(session, None)
        now = time.monotonic()
        for key, left in list(self.left_files.items()):
            if now - left.at > LEFT_FILES_S:
                del self.left_files[key]
        if tab is not None and tab.browser_tab:
            files = {**tab.draft.unsent_files, tab.conv_id: tab.draft.attachments}
            files = {chat: kept for chat, kept in files.items() if kept}
            if files:
                self.left_files[tab.browser_tab] = LeftFiles(files, now)

    def claim_files(self, tab: Tab, browser_tab: str | None) -> None:
        """The tab's page is ``browser_tab`` (a key its browser tab keeps: PAGE_JS's tabKey),
        maybe reloaded: the files attached there before, by chat, are attached here again."""
        tab.browser_tab = browser_tab or None
        left = self.left_files.pop(browser_tab, None) if browser_tab else None
        if left is None:
            return
        tab.draft.unsent_files = {**left.files, **tab.draft.unsent_files}
        if not tab.draft.attachments:
            tab.draft.attachments = tab.draft.unsent_files.pop(tab.conv_id, [])

    def close_silent_tabs(self) -> None:
        """Close each tab none of whose events came for TAB_SILENT_S (every tab's tick calls it)."""
        now = time.monotonic()
        for session, tab in list(self.tabs.items()):
            if now - tab.seen_at > TAB_SILENT_S:
                self.tab_closed(session, said=False)

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
        if self.said_deleted(
            tab, SEND_DELETED_ELSEWHERE if appending else f"{DELETED_ELSEWHERE} {note}".strip()
        ):
            return False
        seen = tab.drawn.seen
        if conv is None or seen is None or seen.conv_id != conv.id:
            return True  # nothing shown of this chat yet (a click that showed it is being answered)
        path = tuple(m.id for m in conv.messages)
        if (path[: len(seen.path)] if appending else path) == seen.path:
            return True
        toasts.warn(SEND_CHANGED_ELSEWHERE if appending else f"{CHANGED_ELSEWHERE} {note}".strip())
        self.replies.notify()
        return False

    def said_deleted(
        self, tab: Tab, message: str = DELETED_ELSEWHERE, say: Callable[[str], None] | None = None
    ) -> bool:
        """Say (once) that the chat the tab showed was deleted elsewhere; whether it was. ``say``:
        the toast (``warn`` by default: an action refused for it)."""
        if tab.lost:
            tab.lost = False
            (say or toasts.warn)(message)
            return True
        return False

    def behind(self, tab: Tab) -> tuple[bool, bool]:
        """Whether the tab's chat was written to (or deleted) since its last render, and whether
        its title and settings boxes are behind what was last sent (``fields``): one read of its
        revision. Apart, because a redraw of the chat is a follow, and Gradio disables ✎ and ↻
        while one runs: were the title of a chat's first message to redraw the whole chat just
        after its first reply, a click on ✎ in that moment would do nothing. (A
        render may find the change first, a deleted chat too: the fields still show it as it was.)"""
        if tab.conv_id is None:
            return False, tab.drawn.fields_shown is not None and tab.drawn.fields_shown[
                0
            ] is not None  # they show a chat deleted since
        try:
            heading = self.store.heading(tab.conv_id)
        except NotFoundError:
            return True, True
        seen = tab.drawn.seen
        chat_behind = (
            seen is not None and seen.conv_id == tab.conv_id and seen.revision != heading.revision
        )
        fields = (tab.conv_id, self.field_values(heading.title, heading.settings))
        fields_behind = tab.drawn.fields_shown is not None and tab.drawn.fields_shown != fields
        return chat_behind, fields_behind

    def settings_in_force(self, tab: Tab) -> ChatSettings:
        """The settings of the tab's conversation, or of its new chat."""
        return self.settings_of(tab, self.shown(tab))

    def settings_of(self, tab: Tab, conv) -> ChatSettings:
        """The settings of ``conv`` (the tab's, already read), or of the tab's new chat."""
        return (
            conv.settings
            if conv is not None
            else (tab.new_chat_settings or self.store.default_settings())
        )

    def backend_of(self, settings: ChatSettings) -> tuple[str, ReplySource]:
        """Where a chat's replies come from: the backend its settings name, else the first."""
        backends = self.source.backends
        name = settings.backend if settings.backend in backends else next(iter(backends))
        return name, backends[name]

    def fields(self, tab: Tab) -> tuple:
        """Title, settings fields and backend for the tab's conversation (sent to the page: the
        tab remembers which chat, with which values, they show)."""
        conv = self.shown(tab)
        values = self.field_values(
            conv.title if conv is not None else "", self.settings_of(tab, conv)
        )
        tab.drawn.fields_shown = (conv.id if conv is not None else None, values)
        return values

    def field_values(self, title: str, s: ChatSettings) -> tuple:
        """What the title box, the settings boxes and the backend show for a chat (FIELD_IDS' order)."""
        return (title, *SettingsForm.showing(s).values(), self.backend_of(s)[0])

    def note_fields(
        self,
        tab: Tab,
        conv_id: int | None,
        title: str | None = None,
        settings: ChatSettings | None = None,
    ) -> None:
        """This tab wrote ``conv_id``'s title or settings as its boxes show them: those boxes are
        not behind (a redraw would send them back, over a value typed meanwhile). Only what it
        wrote: another tab's change to the rest is still redrawn."""
        if tab.drawn.fields_shown is None or tab.drawn.fields_shown[0] != conv_id:
            return
        values = tab.drawn.fields_shown[1]
        if title is not None:
            values = (title, *values[1:])
        if settings is not None:
            values = (values[0], *self.field_values("", settings)[1:])
        tab.drawn.fields_shown = (conv_id, values)

    def conversations(self, tab: Tab):
        return self.store.search(tab.search) if tab.search else self.store.list()

    def exists(self, conv_id: int) -> bool:
        try:
            self.store.revision(conv_id)
        except NotFoundError:
            return False
        return True
