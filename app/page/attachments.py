"""Attach: files whose text goes into the next message (text, PDF, .docx, HTML), each under its name. They belong to their
chat's draft (Drafts.swap_attachments). Files too long for the model's context are said so when
the message is sent (Composer.files_too_long), with a choice: send their first part, or cancel."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from ..chat.attachment_fit import FIRST_PART
from ..chat.composing import attachments_line
from ..chat.documents import DocumentError, attachment_text
from ..chat.uploads import NotUploaded
from . import toasts
from .scripts import CLICK_SEND_JS
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
        tab.draft.too_long = None  # other files: counted again at Send
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
        tab = self.tab(request)
        tab.draft.attachments, tab.draft.too_long = [], None
        return await self.attachments_note(request)

    async def send_first_part(self, request: gr.Request):
        """*Send the first part*: the files attached are cut to what fits, and the message goes
        (CLICK_SEND_JS then presses Send, which counts it again)."""
        tab = self.tab(request)
        if tab.draft.too_long is not None:
            tab.draft.attachments, tab.draft.too_long = tab.draft.too_long.cut, None
        return await self.attachments_note(request)

    async def cancel_too_long(self, request: gr.Request):
        """*Cancel*: nothing is sent; the message stays in the box and its files attached."""
        self.tab(request).draft.too_long = None
        return await self.attachments_note(request)

    async def attachments_note(self, request: gr.Request):
        """The line naming the files attached to the next message, and ✕ to remove them (shown
        only while there are some); the notice of files too long for the model, with its
        choice (shown while a message waits on it); the meter, which counts them."""
        tab = self.tab(request)
        attachments, too_long = tab.draft.attachments, tab.draft.too_long
        notice = ""
        if too_long is not None:
            names = [name.removesuffix(FIRST_PART) for name, _ in attachments]
            notice = too_long.notice(names)
        return (
            attachments_line(attachments),
            gr.update(visible=bool(attachments)),
            gr.update(visible=too_long is not None),
            notice,
            # the meter counts the files with the message (it kept the count without them)
            await asyncio.to_thread(self.meter_of, tab, self.shown(tab)),
        )

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
        with gr.Row(elem_id="too-long", visible=False) as too_long:  # shown by attachments_note
            too_long_text = gr.Markdown("", elem_id="too-long-text")
            first_part_btn = gr.Button(
                "Send the first part", elem_id="send-first-part-btn", size="sm", scale=0
            )
            cancel_btn = gr.Button("Cancel", elem_id="cancel-too-long-btn", size="sm", scale=0)
        return SimpleNamespace(
            attached=attached,
            unattach_btn=unattach_btn,
            too_long=too_long,
            too_long_text=too_long_text,
            first_part_btn=first_part_btn,
            cancel_too_long_btn=cancel_btn,
        )

    def wire_attachments(self, w: Wiring) -> None:
        m, note = w.main, w.attachments_note["outputs"]
        m.attach_btn.upload(self.attach, inputs=m.attach_btn, outputs=note, **QUICK)
        m.unattach_btn.click(self.unattach, outputs=note, **QUICK)
        m.cancel_too_long_btn.click(self.cancel_too_long, outputs=note, **QUICK)
        m.first_part_btn.click(self.send_first_part, outputs=note, **QUICK).then(
            None, js=CLICK_SEND_JS, **QUICK
        )
