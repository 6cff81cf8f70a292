"""The chats sidebar: the list and its search, New chat, and Manage (rename, delete; export and
import in chat_files.py). Showing another chat keeps the message box's draft, and the files
attached, with the chat left (drafts.py)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import gradio as gr

from ..chat.settings_form import SettingsForm, with_backend_of
from ..chat.store import NotFoundError
from ..chat.view import WINDOW
from . import toasts
from .page_view import as_update
from .scripts import (
    CLICK_DOWNLOAD_JS,
    CONFIRM_DELETE_CHAT_JS,
    LEAVE_CHAT_IMPORT_JS,
    LEAVE_CHAT_NEW_JS,
    LEAVE_CHAT_SELECT_JS,
)
from .tabs import Tab, TabState
from .wiring import QUICK, Wiring

TITLE_LIMIT = 200  # characters of a chat's title that Rename keeps
# Manage's line for a new chat, in place of Rename, Delete and Export
NO_CHAT_ACTIONS = (
    "This chat is stored when you send its first message: then you can rename, delete or export it."
)


class ChatsPanel(TabState):
    """The sidebar's chats: which one the tab shows, and what Manage does to it."""

    def show(
        self, tab: Tab, conv_id: int | None, clicked_at: float | None, text: str | None = None
    ):
        """The tab shows ``conv_id`` from the click at ``clicked_at`` (browser ms) on. The message
        box's ``text`` and the files attached stay with the chat shown before; what the box is to
        show now, for the page (``draft_for_box``; the files: ``swap_attachments``)."""
        box = self.swap_draft(tab, conv_id, text)
        self.swap_attachments(tab, conv_id)
        tab.events.shown_before, tab.events.shown_since = tab.conv_id, clicked_at or 0.0
        tab.conv_id, tab.focus, tab.picked, tab.bar_note = conv_id, None, True, None
        tab.window = WINDOW
        self.replies.notify()
        return self.draft_for_box(clicked_at, text, box)

    async def select(
        self,
        conv_id: int | None,
        clicked_at: float | None,
        request: gr.Request,
        text: str | None = None,
    ):
        """A click on a chat in the sidebar: the tab shows it (its draft in the message box)."""
        tab = self.tab(request)
        box = self.show(tab, conv_id, clicked_at, text)
        return (box, *self.fields(tab))

    async def new_chat(
        self,
        clicked_at: float | None,
        request: gr.Request,
        text: str | None = None,
        form: SettingsForm | None = None,
    ):
        """New chat starts from the settings of the chat shown (its backend too), as in peer apps:
        a user who changed them need not set them again for every chat. ``form``: the settings
        boxes as the click found them, so a value just typed counts even
        when its box's save comes after the click (else the new chat would start from the value
        before it); a value the checks refuse is the one in force (its save says why)."""
        tab = self.tab(request)
        start_with = self.settings_in_force(tab)
        if form is not None:
            settings, problems = self.checked_form(form, start_with)
            if (
                form != tab.events.refused_form
            ):  # else the box's own save said why, just before the click
                self.settings_refused(
                    problems
                )  # the box left by this click may save nothing (settings_changed)
            start_with = with_backend_of(
                replace(settings, **{name: getattr(start_with, name) for name in problems}),
                start_with,
            )
        tab.new_chat_settings, tab.events.refused_form = start_with, None
        box = self.show(tab, None, clicked_at, text)
        return (box, *self.fields(tab))

    async def rename(self, title: str, request: gr.Request):
        tab = self.tab(request)
        title = (title or "").strip()
        if tab.conv_id is None:
            toasts.warn("Start a chat first, then rename it.")
        elif not title:
            toasts.warn("A title cannot be empty.")
        else:
            if (
                len(title) > TITLE_LIMIT
            ):  # said, not done silently: the end of a long title would go unseen
                toasts.inform(f"The title keeps its first {TITLE_LIMIT} characters.")
            self.store.rename(tab.conv_id, title[:TITLE_LIMIT])
        tab.drawn.sidebar = self.render_sidebar(tab)
        conv = self.shown(tab)  # the box shows the title the chat has (a refused one is put back)
        if conv is not None:
            self.note_fields(tab, conv.id, title=conv.title)
        return as_update("sidebar", tab.drawn.sidebar), conv.title if conv is not None else ""

    async def delete(
        self,
        confirmed: bool,
        clicked_at: float | None,
        request: gr.Request,
        text: str | None = None,
    ):
        tab = self.tab(request)
        if (
            not confirmed or tab.conv_id is None
        ):  # the page emptied the box of a confirmed click: given back
            return (
                self.draft_for_box(clicked_at, text, None) if confirmed else gr.skip(),
                *self.fields(tab),
            )
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
        tab.draft.unsent.pop(deleted, None)  # the deleted chat's draft goes with it, its files too
        tab.draft.unsent_files.pop(deleted, None)
        for left in self.left_files.values():
            left.files.pop(deleted, None)
        return (box, *self.fields(tab))

    async def search(self, query: str, request: gr.Request):
        tab = self.tab(request)
        tab.search = (query or "").strip()
        tab.drawn.sidebar = self.render_sidebar(tab)
        return as_update("sidebar", tab.drawn.sidebar)

    @staticmethod
    def chats_layout(new_btn: gr.Button) -> SimpleNamespace:
        """Search, the chats, and Manage (title, delete, export, import) with the hidden boxes its scripts fill."""
        search = gr.Textbox(
            show_label=False,
            label="Search chats",
            placeholder="Search chats",
            elem_id="search",
            max_lines=1,
        )
        conv_list = gr.Radio(
            choices=[], label="Conversations", elem_id="conv-list", interactive=True
        )
        with gr.Accordion("Manage", open=False, elem_id="manage"):
            manage = ChatsPanel.manage_layout()
            hidden = ChatsPanel.script_boxes_layout()
        return SimpleNamespace(
            new_btn=new_btn, search=search, conv_list=conv_list, **vars(manage), **vars(hidden)
        )

    @staticmethod
    def manage_layout() -> SimpleNamespace:
        """Manage: the title, Delete and Export of a stored chat (else a line saying when they
        come), Import, and the file an export hands the hidden download link."""
        # shown once the chat is stored (Rendering.render: the page's load renders it for a stored chat)
        with gr.Column(elem_id="chat-actions", visible=False) as actions:
            title_box = gr.Textbox(label="Title", elem_id="title-input", max_lines=1)
            rename_btn = gr.Button("Rename", elem_id="rename-btn", size="sm")
            delete_btn = gr.Button("Delete chat", elem_id="delete-btn", size="sm", variant="stop")
            export_md = gr.Button("Export Markdown", elem_id="export-md-btn", size="sm")
            export_json = gr.Button("Export JSON", elem_id="export-json-btn", size="sm")
        no_actions = gr.Markdown(NO_CHAT_ACTIONS, elem_id="no-chat-actions", visible=False)
        import_btn = gr.UploadButton(
            "Import chat (JSON)", elem_id="import-btn", size="sm"
        )  # any file: see IMPORTABLE
        import_note = gr.Markdown("", elem_id="import-note")  # what the last import brought in
        export_file = gr.File(elem_id="export-file", visible="hidden", interactive=False)
        return SimpleNamespace(
            actions=actions,
            no_actions=no_actions,
            title_box=title_box,
            rename_btn=rename_btn,
            delete_btn=delete_btn,
            export_md=export_md,
            export_json=export_json,
            import_btn=import_btn,
            import_note=import_note,
            export_file=export_file,
        )

    @staticmethod
    def script_boxes_layout() -> SimpleNamespace:
        """Hidden boxes that the page's scripts fill for an event, or read its answer from."""
        confirmed = gr.Checkbox(visible="hidden", elem_id="confirmed")
        clicked_at = gr.Number(visible="hidden", elem_id="clicked-at")  # STAMP_JS fills it
        after_click = gr.Number(visible="hidden", elem_id="after-click")  # SEND_JS fills it
        shown_draft = gr.Textbox(
            visible="hidden", elem_id="shown-draft"
        )  # Drafts.draft_for_box: APPLY_DRAFT_JS reads it
        fields_redrawn = gr.Textbox(
            visible="hidden", elem_id="fields-redrawn"
        )  # Ticks.redraw_boxes: APPLY_REDRAWN_FIELDS_JS reads it
        in_address = gr.Number(
            visible="hidden", elem_id="chat-in-address"
        )  # ASKED_CHATS_JS fills them
        remembered = gr.Number(visible="hidden", elem_id="chat-remembered")
        browser_tab = gr.Textbox(visible="hidden", elem_id="browser-tab")
        return SimpleNamespace(
            confirmed=confirmed,
            clicked_at=clicked_at,
            after_click=after_click,
            shown_draft=shown_draft,
            fields_redrawn=fields_redrawn,
            in_address=in_address,
            remembered=remembered,
            browser_tab=browser_tab,
        )

    def wire_chats(self, w: Wiring) -> None:
        """Each of New chat, a click in the list, Delete and Import shows another chat: the
        message box's text stays with the chat left, and the box shows the draft of the chat
        shown (swap_draft, LEAVE_CHAT_*_JS)."""
        self.wire_chat_list(w)
        self.wire_manage(w)

    def wire_chat_list(self, w: Wiring) -> None:
        """New chat, a click on a chat, and the search."""
        c, m = w.chats, w.main

        async def new_chat_from_page(
            request: gr.Request, *, clicked_at: float | None, text: str | None, **form: Any
        ):
            return await self.new_chat(clicked_at, request, text, SettingsForm(**form))

        w.then_redraw(
            c.new_btn.click(
                new_chat_from_page,
                inputs_kwargs=w.with_form(clicked_at=c.clicked_at, text=m.msg),
                outputs=w.shown_fields,
                js=LEAVE_CHAT_NEW_JS,
                api_name="new_chat",
                **QUICK,
            ),
            draft=True,
        )
        w.then_redraw(
            c.conv_list.input(
                self.select,
                inputs=[c.conv_list, c.clicked_at, m.msg],
                outputs=w.shown_fields,
                js=LEAVE_CHAT_SELECT_JS,
                **QUICK,
            ),
            draft=True,
        )
        # .change, not .input: Gradio's Textbox sends .input on key presses only (not on
        # Backspace, cut or paste); the box is never an output, so only the user changes it
        c.search.change(self.search, inputs=c.search, outputs=c.conv_list, **QUICK)

    def wire_manage(self, w: Wiring) -> None:
        """Manage: Rename (its button or Enter in the title), Delete, Export, Import."""
        c, m = w.chats, w.main
        for rename in (c.rename_btn.click, c.title_box.submit):
            rename(self.rename, inputs=c.title_box, outputs=[c.conv_list, c.title_box], **QUICK)
        w.then_redraw(
            c.delete_btn.click(
                self.delete,
                inputs=[c.confirmed, c.clicked_at, m.msg],
                outputs=w.shown_fields,
                js=CONFIRM_DELETE_CHAT_JS,
                **QUICK,
            ),
            draft=True,
        )
        for button, handler in ((c.export_md, self.export_md), (c.export_json, self.export_json)):
            button.click(handler, outputs=c.export_file, **QUICK).success(
                None, js=CLICK_DOWNLOAD_JS
            )
        w.then_redraw(
            c.import_btn.upload(
                self.import_chat,
                inputs=[c.import_btn, c.clicked_at, m.msg],
                outputs=[*w.shown_fields, c.search, c.import_note],
                js=LEAVE_CHAT_IMPORT_JS,
                **QUICK,
            ),
            draft=True,
        )
