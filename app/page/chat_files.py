"""Chats as files: Export (Markdown or JSON, through the page's hidden download link) and Import
(a chat file read, checked and stored, then shown)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import gradio as gr

from ..chat.export_name import export_stem
from ..chat.store import IMPORT_LIMIT_BYTES, BadImportFile, plural
from ..chat.uploads import NotUploaded
from ..chat.view import WINDOW, markdown_literal
from . import toasts
from .tabs import TabState

# Import and Attach take any file and say what is wrong with one they refuse: with Gradio's
# file_types a file of another type would be refused by Gradio first, in a red "Error" toast.
IMPORTABLE = (
    'a chat exported here as JSON (Export JSON) or an OpenAI-style JSON file ({"messages": [...]})'
)


class ChatFiles(TabState):
    """Manage's Export and Import, for the chat a tab shows."""

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
