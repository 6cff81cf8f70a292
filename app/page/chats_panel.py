"""The chats sidebar: the list and its search, New chat, and Manage (rename, delete, export,
import). Showing another chat keeps the message box's draft, and the files attached, with the
chat left (``swap_draft``, ``swap_attachments``)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr

from ..chat.export_name import export_stem
from ..chat.settings_form import SettingsForm, with_backend_of
from ..chat.store import IMPORT_LIMIT_BYTES, BadImportFile, NotFoundError, plural
from ..chat.uploads import NotUploaded
from ..chat.view import WINDOW, markdown_literal
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
# Import and Attach take any file and say what is wrong with one they refuse: with Gradio's
# file_types a file of another type would be refused by Gradio first, in a red "Error" toast.
IMPORTABLE = (
    'a chat exported here as JSON (Export JSON) or an OpenAI-style JSON file ({"messages": [...]})'
)
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
        tab leaves are kept for it, and those kept for ``conv_id`` are attached again (no one
        has to attach them again on coming back)."""
        if conv_id == tab.conv_id:
            return
        if tab.draft.attachments:
            tab.draft.unsent_files[tab.conv_id] = tab.draft.attachments
        else:
            tab.draft.unsent_files.pop(tab.conv_id, None)
        tab.draft.attachments = tab.draft.unsent_files.pop(conv_id, [])

    @staticmethod
    def swap_draft(tab: Tab, conv_id: int | None, text: str | None) -> str | None:
        """A draft belongs to its chat: the message box's ``text`` (None: not known) is kept for
        the chat the tab leaves, and the box is to show the unsent text of ``conv_id`` (empty when
        it has none; None: the chat shown does not change, the box keeps its text). The message
        just sent from the box is no draft (a click on another chat can reach the server while the
        box still shows it)."""
        if text is None or conv_id == tab.conv_id:
            return None
        sent = tab.draft.last_send is not None and tab.draft.last_send[:2] == (
            tab.conv_id,
            text.strip(),
        )
        if text.strip() and not sent:
            tab.draft.unsent[tab.conv_id] = text
        else:
            tab.draft.unsent.pop(tab.conv_id, None)
        return tab.draft.unsent.pop(conv_id, "")

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
        return (box, *self.fields(tab))

    def export(self, kind: str, request: gr.Request):
        """Write the shown chat to a file for the hidden download link, which the page clicks."""
        conv = self.shown(self.tab(request))
        if conv is None or not conv.messages:
            toasts.warn("Nothing to export yet: this chat has no messages.")
            return gr.skip()
        text = (
            self.store.export_markdown(conv.id) if kind == "md" else self.store.export_json(conv.id)
        )
        # inside the app's private files folder (GRADIO_TEMP_DIR, app/cli.py), removed at exit
        folder = Path(tempfile.mkdtemp(prefix="export-", dir=os.environ.get("GRADIO_TEMP_DIR")))
        path = folder / f"{export_stem(conv.title)}.{kind}"
        path.write_text(text, encoding="utf-8")
        return str(path)

    async def export_md(self, request: gr.Request):
        return self.export("md", request)

    async def export_json(self, request: gr.Request):
        return self.export("json", request)

    async def import_chat(
        self,
        path: str | None,
        clicked_at: float | None,
        request: gr.Request,
        text: str | None = None,
    ):
        """Import a chat file and show it. What was imported is said in a line under the Import
        button, not a toast: a toast opens over the top of the chat, where the imported chat's first
        message and its buttons are, and would cover them for ten seconds. A refused file gets a
        toast (nothing was imported, and the reason must be seen); the message box's text, taken
        by the upload (LEAVE_CHAT_IMPORT_JS), is given back."""
        tab = self.tab(request)
        if not path:
            return (
                self.draft_for_box(clicked_at, text, None),
                *self.fields(tab),
                gr.skip(),
                gr.skip(),
            )
        try:
            file = self.uploads.take(path)
            try:
                if file.suffix.lower() != ".json":
                    raise BadImportFile(f"{file.name} is not a .json file; import {IMPORTABLE}")
                if file.stat().st_size > IMPORT_LIMIT_BYTES:
                    raise BadImportFile(
                        f"the file is larger than {IMPORT_LIMIT_BYTES // 1_000_000} MB"
                    )
                data = file.read_bytes()
            finally:
                self.uploads.discard(str(file))  # read (or refused): its text is all the page keeps
            conv = self.store.import_conversation(data)
        except NotUploaded as exc:
            toasts.warn(f"Not imported: {exc}.")
            return (self.draft_for_box(clicked_at, text, None), *self.fields(tab), gr.skip(), "")
        except BadImportFile as exc:
            toasts.warn(f"Not imported: {exc}")
            return (self.draft_for_box(clicked_at, text, None), *self.fields(tab), gr.skip(), "")
        tab.search = ""  # the imported chat is listed
        box = self.show(tab, conv.id, clicked_at, text)
        count = len(conv.messages)
        shown = f"{count:,} {plural('message', count)}" + (
            f"; the last {WINDOW} shown" if count > WINDOW else " shown"
        )
        return (box, *self.fields(tab), "", f"Imported “{markdown_literal(conv.title)}” ({shown}).")

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
            # shown once the chat is stored (ViewEvents.render: the page's load renders it for a stored chat)
            with gr.Column(elem_id="chat-actions", visible=False) as actions:
                title_box = gr.Textbox(label="Title", elem_id="title-input", max_lines=1)
                rename_btn = gr.Button("Rename", elem_id="rename-btn", size="sm")
                delete_btn = gr.Button(
                    "Delete chat", elem_id="delete-btn", size="sm", variant="stop"
                )
                export_md = gr.Button("Export Markdown", elem_id="export-md-btn", size="sm")
                export_json = gr.Button("Export JSON", elem_id="export-json-btn", size="sm")
            no_actions = gr.Markdown(NO_CHAT_ACTIONS, elem_id="no-chat-actions", visible=False)
            import_btn = gr.UploadButton(
                "Import chat (JSON)", elem_id="import-btn", size="sm"
            )  # any file: see IMPORTABLE
            import_note = gr.Markdown("", elem_id="import-note")  # what the last import brought in
            export_file = gr.File(elem_id="export-file", visible="hidden", interactive=False)
            confirmed = gr.Checkbox(visible="hidden", elem_id="confirmed")
            clicked_at = gr.Number(visible="hidden", elem_id="clicked-at")  # STAMP_JS fills it
            after_click = gr.Number(visible="hidden", elem_id="after-click")  # SEND_JS fills it
            shown_draft = gr.Textbox(
                visible="hidden", elem_id="shown-draft"
            )  # ChatsPanel.draft_for_box: APPLY_DRAFT_JS reads it
            fields_redrawn = gr.Textbox(
                visible="hidden", elem_id="fields-redrawn"
            )  # ViewEvents.redraw_boxes: APPLY_REDRAWN_FIELDS_JS reads it
            in_address = gr.Number(
                visible="hidden", elem_id="chat-in-address"
            )  # ASKED_CHATS_JS fills them
            remembered = gr.Number(visible="hidden", elem_id="chat-remembered")
        return SimpleNamespace(
            new_btn=new_btn,
            search=search,
            conv_list=conv_list,
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
            confirmed=confirmed,
            clicked_at=clicked_at,
            after_click=after_click,
            shown_draft=shown_draft,
            fields_redrawn=fields_redrawn,
            in_address=in_address,
            remembered=remembered,
        )

    def wire_chats(self, w: Wiring) -> None:
        """Each of these shows another chat: the message box's text stays with the chat left, and
        the box shows the draft of the chat shown (swap_draft, LEAVE_CHAT_*_JS)."""
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
        c.rename_btn.click(
            self.rename, inputs=c.title_box, outputs=[c.conv_list, c.title_box], **QUICK
        )
        c.title_box.submit(
            self.rename, inputs=c.title_box, outputs=[c.conv_list, c.title_box], **QUICK
        )
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
