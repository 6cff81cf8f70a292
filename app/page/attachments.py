"""Attach: files whose text goes into the next message (text, PDF, .docx, HTML), each under its name. They belong to their
chat's draft (Drafts.swap_attachments)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from ..chat.composing import attachments_line
from ..chat.documents import DocumentError, attachment_text
from ..chat.uploads import NotUploaded
from . import toasts
from .tabs import TabState
from .wiring import QUICK, Wiring


def readable_attachment(file: Path) -> tuple[str, str] | None:
    """A file to attach as (its name, its text: a PDF's, a .docx's, an HTML page's, or the file
    as UTF-8 text); None, with a warning saying why, for one that cannot be read."""
    try:
        return file.name, attachment_text(file)
    except DocumentError as exc:
        toasts.warn(f"Not attached: {exc}.")
        return None


class Attachments(TabState):
    """The files attached to a tab's next message."""

    async def attach(self, paths: list[str] | None, request: gr.Request):
        """Text files go into the next message, each under its name: several may be picked at once
        (one trip to the file chooser for them all); the same file (name
        and text) attached again goes in once, and a toast says so."""
        tab = self.tab(request)
        if not paths:
            return gr.skip()
        for path in paths:
            try:
                uploaded = self.uploads.take(path)
            except NotUploaded as exc:
                toasts.warn(f"Not attached: {exc}.")
                continue
            file = readable_attachment(uploaded)
            self.uploads.discard(str(uploaded))  # read (or refused): its text is kept in the tab
            if file is None:
                continue
            if file in tab.draft.attachments:  # the same file again: it goes into the message once
                toasts.inform(f"{file[0]} is already attached: it goes into your message once.")
            else:
                tab.draft.attachments.append(file)
        return await self.attachments_note(request)

    async def unattach(self, request: gr.Request):
        """✕ Remove attachments: the files attached are not sent after all."""
        self.tab(request).draft.attachments = []
        return await self.attachments_note(request)

    async def attachments_note(self, request: gr.Request):
        """The line naming the files attached to the next message, and ✕ to remove them (shown
        only while there are some)."""
        attachments = self.tab(request).draft.attachments
        return attachments_line(attachments), gr.update(visible=bool(attachments))

    @staticmethod
    def attachments_layout() -> SimpleNamespace:
        with gr.Row(elem_id="attached-row"):
            attached = gr.Markdown("", elem_id="attached")
            unattach_btn = gr.Button(
                "✕ Remove attachments",
                elem_id="remove-attachments-btn",
                size="sm",
                scale=0,
                min_width=170,
                visible=False,
            )  # shown while files wait for the next message
        return SimpleNamespace(attached=attached, unattach_btn=unattach_btn)

    def wire_attachments(self, w: Wiring) -> None:
        m = w.main
        m.attach_btn.upload(
            self.attach, inputs=m.attach_btn, outputs=[m.attached, m.unattach_btn], **QUICK
        )
        m.unattach_btn.click(self.unattach, outputs=[m.attached, m.unattach_btn], **QUICK)
