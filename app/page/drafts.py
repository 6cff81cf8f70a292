"""A draft belongs to its chat: what the message box held, and the files attached, stay with the
chat a tab leaves and come back when the tab shows that chat again."""

from __future__ import annotations

import json

import gradio as gr

from .tabs import Tab


class Drafts:
    """The message box's text and the files attached, kept by chat as the tab shows another."""

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
        tab.draft.too_long = None  # a notice about this chat's message
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
