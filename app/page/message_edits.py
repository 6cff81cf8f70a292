"""✎: a message's new version (the old one stays, ‹ › shows it again), and a chat's title that
follows its first message while the user has not renamed the chat."""

from __future__ import annotations

import gradio as gr

from ..chat.composing import branch_note, edit_text
from ..chat.store import MessageStats, title_from
from . import toasts
from .tabs import BUSY_HINT, Tab, TabState

# an edit refused (✎'s box closes on Save) keeps its text in the message box (kept_edit)
EDIT_KEPT = (
    "Your edit was not saved: its text is now in the message box, to copy into ✎ on the message once you have "
    "looked the chat over."
)


def kept_edit(box: str | None, edited: str):
    """The message box holding a refused edit's text: after what the box held (a draft is kept),
    or alone; nothing to keep for an empty edit."""
    if not edited:
        return gr.skip()
    return f"{box.rstrip()}\n\n{edited}" if box and box.strip() else edited


class MessageEdits(TabState):
    """What ✎ does to a message of the chat shown, and the title that follows the first one."""

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
            box = kept_edit(
                text, new_text
            )  # the edit's index is into the chat as the tab showed it
        elif item is None or item.is_line or item.source is None:
            toasts.warn("Edit the message's own text, not the line above or under it.")
        elif self.replies.is_busy(conv.id):
            toasts.warn(f"{BUSY_HINT} {EDIT_KEPT}")
            box = kept_edit(text, new_text)
        elif not new_text:
            toasts.warn("A message cannot be empty.")
        elif new_text != item.source.content:
            target = item.source
            edited = MessageStats(edited=True) if target.role == "assistant" else None
            new = self.store.add_message(conv.id, target.parent_id, target.role, new_text, edited)
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
        if (
            not first
            or conv.title != title_from(edited.content)
            or conv.title == title_from(new_text)
        ):
            return False
        self.store.rename(conv.id, title_from(new_text))
        self.note_fields(tab, conv.id, title=title_from(new_text))  # the title box is sent it
        return True
