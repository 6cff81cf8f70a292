"""The message box and the chat's buttons: Send, Stop, Continue and ↻ (regenerate); with ✎
(message_edits.py), their layout and events. Each asks for a reply (turns.py) and returns at once;
the follow renders it."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import gradio as gr

from ..chat.attachment_fit import attachments_too_long
from ..chat.composing import with_attachments
from ..chat.settings_form import SettingsForm
from ..chat.store import NotFoundError, title_from
from ..chat.view import can_continue, typed_text
from . import toasts
from .scripts import SEND_JS, STAMP_JS, SYNC_SEND_JS
from .tabs import BUSY_HINT, Tab, TabState
from .wiring import QUICK, Wiring

DOUBLE_SEND_MS = (
    1000  # the same text sent again within this is a double click or Enter, not a second message
)


class Composer(TabState):
    """What the message box and the chat's own buttons ask of the replies."""

    async def send(
        self,
        text: str,
        form: SettingsForm,
        clicked_at: float | None,
        request: gr.Request,
        after_click: float | None = None,
    ):
        """Store the message (starting a chat if needed) and ask for its reply; a message sent
        while the chat replies is shown at once and answered next. Returns the answer for the
        message box (``draft_for_box``: the page emptied it at Enter; a message not sent goes
        back) and the status line: Generating as soon as the reply is asked for (``status_of``).
        ``after_click``: Enter came before the answer to a click that showed another chat
        (SEND_JS; 0: not), so the settings boxes sent are those of the chat shown before."""
        tab = self.tab(request)
        typed = text or ""
        kept, sent = (
            self.draft_for_box(clicked_at, typed, None),
            self.draft_for_box(clicked_at, typed, ""),
        )
        # as typed: text taken from a message shown here other than by Copy (dragged, or pasted
        # with a middle click on Linux) brings the marks that show its HTML (view.shown_literally)
        text = typed_text(typed).strip()
        if clicked_at is not None and clicked_at <= tab.events.shown_since:
            self.keep_unsent(tab, text)  # sent from the chat shown before a click handled first
            return sent, gr.skip()  # (kept as that chat's draft, not put back here)
        sent_at = clicked_at if clicked_at is not None else time.time() * 1000
        if self.nothing_to_send(tab, text, sent_at, after_click):
            return sent, gr.skip()
        if not self.may_send(tab, form, after_click):
            return kept, gr.skip()  # the message goes back to the box; a toast said why
        if await self.files_too_long(tab, text):
            return kept, gr.skip()  # the notice under the box offers their first part
        self.store_question(tab, text, sent_at)
        tab.focus = None  # a message clicked above: the versions bar follows the new last turn
        self.submit(tab, tab.conv_id, request, self.turn_for(tab.conv_id), clicked_at)
        tab.drawn.status = self.status_of(tab)
        return sent, tab.drawn.status

    @staticmethod
    def nothing_to_send(tab: Tab, text: str, sent_at: float, after_click: float | None) -> bool:
        """Whether a send sends nothing: Enter on an empty box (nor after a click: not its
        files), or the same message again at once, a double click or Enter, sent once (in either
        order: Gradio may start the second send of a double click before the first)."""
        if not text and (after_click or not tab.draft.attachments):
            return True
        last = tab.draft.last_send
        return (
            last is not None
            and last[:2] == (tab.conv_id, text)
            and abs(sent_at - last[2]) < DOUBLE_SEND_MS
        )

    def may_send(self, tab: Tab, form: SettingsForm, after_click: float | None) -> bool:
        """Whether the message may go into the chat shown, else a toast says why: the chat is
        as the tab shows it (else the page shows the chat as it is now), the settings boxes as
        Enter found them are saved first, and the model has loaded. After a click whose answer
        had not come (``after_click``), the boxes were still those of the chat shown before:
        that chat's, not saved here."""
        conv = self.shown(tab)
        if not self.shows_current(tab, conv, appending=True):
            return False
        checked = self.checked_form(form, self.settings_of(tab, conv))
        if not after_click and not self.save_settings(tab, *checked):
            return False  # the toast says which setting
        if not self.backend_of(self.settings_in_force(tab))[1].ready:
            toasts.warn(
                "The model is still loading; send your message once it has loaded (the status line stops saying Loading)."
            )
            return False
        return True

    async def files_too_long(self, tab: Tab, text: str) -> bool:
        """Whether the files attached make the message too long for the model: then it is not
        sent, and the notice under the box (Attachments.attachments_note) says how long they
        are and how much fits, with their first part ready to send (attachment_fit.py)."""
        tab.draft.too_long = None
        if not tab.draft.attachments:
            return False
        settings = self.settings_in_force(tab)
        source = self.backend_of(settings)[1]
        tab.draft.too_long = await asyncio.to_thread(
            attachments_too_long, settings, source, text, list(tab.draft.attachments)
        )
        return tab.draft.too_long is not None

    def store_question(self, tab: Tab, text: str, sent_at: float) -> None:
        """Store the message, with the files attached, at the end of the tab's chat (a new chat:
        the chat and its first message in one transaction, so a failure leaves no empty chat).

        A message sent to a chat that is not replying is answered on its own: the questions at
        the chat's end that nothing answers (the chat stopped before their turn: Stop, a closed
        tab, the app stopped) are marked as left unanswered, in the transaction that stores it,
        so the model does not see them and they keep their mark (view.left_unanswered). Messages
        sent while it replies are answered together by the reply after the last of them. (A
        reply being stopped answers nothing more: ReplyManager.answers_later.)"""
        raw_text, text = text, with_attachments(text, tab.draft.attachments)
        leave_unanswered = tab.conv_id is not None and not self.replies.answers_later(tab.conv_id)
        if tab.conv_id is None:
            tab.conv_id = self.store.create(
                title=title_from(text), settings=tab.new_chat_settings, first_message=text
            ).id
            tab.picked = True
            shown = tab.drawn.fields_shown
            if shown is not None and shown[0] is None:  # the boxes show its settings: its title
                tab.drawn.fields_shown = (tab.conv_id, shown[1])  # box (empty) is redrawn, alone
        else:
            self.store.append(tab.conv_id, "user", text, leave_unanswered=leave_unanswered)
        tab.draft.attachments = []  # sent with the message: only now (a failed store keeps them)
        tab.draft.last_send = (tab.conv_id, raw_text, sent_at)

    def keep_unsent(self, tab: Tab, text: str) -> None:
        """A message sent (Enter) just before a click that showed another chat, and reached by
        the server after that click: it was typed in the chat shown before (``tab.events.shown_before``),
        so it is neither sent into the chat shown now nor are its settings boxes saved there. Its
        text stays that chat's draft (``show`` kept its files there), and a toast says so."""
        chat = tab.events.shown_before
        if text:
            kept = tab.draft.unsent.get(chat, "")
            if text not in kept:  # the click usually carried the box's text already (swap_draft)
                tab.draft.unsent[chat] = f"{kept.rstrip()}\n\n{text}" if kept.strip() else text
        if not text and not tab.draft.unsent_files.get(chat):
            return  # an empty box, no files: nothing was sent
        try:
            title = self.store.get(chat).title if chat is not None else "your new chat"
        except NotFoundError:
            tab.draft.unsent.pop(chat, None)
            toasts.warn(
                f"Not sent: the chat it was typed in was deleted. Your message was: {text}"
                if text
                else "Not sent: the chat it was typed in was deleted, and its files with it."
            )
            return
        toasts.warn(
            f"Not sent: you switched chats; your message is kept as the draft of «{title}»."
        )

    async def regenerate(self, request: gr.Request):
        """↻: a new version of the last reply (the old one stays, ‹ › shows it again)."""
        tab = self.tab(request)
        conv = self.shown(tab)
        users = [m for m in conv.messages if m.role == "user"] if conv is not None else []
        if not self.shows_current(tab, conv):
            pass
        elif not users:
            toasts.warn("Nothing to regenerate yet.")
        elif self.replies.is_busy(conv.id):
            toasts.warn(BUSY_HINT)
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
            toasts.warn("Only a reply that was stopped or cut at max tokens can be continued.")
        elif self.replies.is_busy(conv.id):
            toasts.warn(BUSY_HINT)
        else:
            self.submit(
                tab, conv.id, request, self.turn_for(conv.id, continue_id=conv.messages[-1].id)
            )

    async def stop(self, clicked_at: float | None, request: gr.Request) -> None:
        """Stop the chat this tab shows: its reply ends, and a message sent while it replied stays
        in the chat unanswered (↻ answers it), as the user who pressed Stop expects; a message
        sent instead is answered on its own (``send``: the questions waiting are left unanswered)."""
        tab = self.tab(request)
        if not self.replies.stop(tab.conv_id) and clicked_at is not None:
            tab.events.early_stop = (
                clicked_at  # a message clicked before it may not have arrived yet
            )

    @staticmethod
    def continue_layout() -> SimpleNamespace:
        # Continue floats over the chat's bottom right corner, under the reply it extends
        # (css.py: CONTINUE_FLOATS): a fourth button in the composer's row would squeeze the message box
        with gr.Row(elem_id="continue-anchor"):
            continue_btn = gr.Button(
                "Continue", elem_id="continue-btn", size="sm", scale=0, min_width=90, visible=False
            )
        return SimpleNamespace(continue_btn=continue_btn)

    @staticmethod
    def composer_layout() -> SimpleNamespace:
        with gr.Row(elem_id="composer"):
            attach_btn = gr.UploadButton(
                "Attach",
                elem_id="attach-btn",
                size="sm",
                scale=0,
                min_width=70,
                file_count="multiple",
            )  # any text files, several at once
            msg = gr.Textbox(
                label="Message",
                show_label=False,
                elem_id="msg-input",
                scale=8,
                lines=1,
                max_lines=8,
                autofocus=True,
                placeholder="Message (Enter sends, Shift+Enter for a new line)",
            )
            # the tokens the next message would use of the model's context (Rendering.meter_of,
            # Composer.typed), beside the box: a line under it made the page taller than the screen
            meter = gr.Markdown(
                "", elem_id="context-meter", elem_classes="hint", scale=0, min_width=150
            )
            send_btn = gr.Button(
                "Send", elem_id="send-btn", variant="primary", scale=1, min_width=80
            )
            stop_btn = gr.Button(
                "Stop", elem_id="stop-btn", variant="secondary", scale=1, min_width=80
            )
        return SimpleNamespace(
            attach_btn=attach_btn, msg=msg, send_btn=send_btn, stop_btn=stop_btn, meter=meter
        )

    async def typed(self, text: str | None, request: gr.Request) -> str:
        """The meter for the text now in the message box (typed, pasted, emptied by Send or by
        showing another chat); Gradio runs only the last of the changes that came while one
        was counted (trigger_mode "always_last"), so fast typing costs a count now and then. The
        count runs in a thread: a long chat's takes a tenth of a second or more."""
        tab = self.tab(request)
        tab.meter.typed = typed_text(text or "").strip()
        return await asyncio.to_thread(self.meter_of, tab, self.shown(tab))

    def wire_composer(self, w: Wiring) -> None:
        c, m = w.chats, w.main

        async def send_from_page(
            text: str,
            request: gr.Request,
            *,
            clicked_at: float | None,
            after_click: float | None,
            **form: Any,
        ):
            return await self.send(text, SettingsForm(**form), clicked_at, request, after_click)

        stamps = w.form_then(
            clicked_at=c.clicked_at, after_click=c.after_click
        )  # SEND_JS: the box, the form, the stamps
        for trigger in (m.msg.submit, m.send_btn.click):
            w.then_redraw(
                trigger(
                    send_from_page,
                    inputs=[m.msg],
                    inputs_kwargs=stamps,
                    outputs=[c.shown_draft, m.status],
                    js=SEND_JS,
                    api_name="send",
                    **QUICK,
                ),
                draft=True,
            )
        m.msg.change(None, js=SYNC_SEND_JS)
        m.msg.change(
            self.typed,
            inputs=m.msg,
            outputs=m.meter,
            show_progress="hidden",
            concurrency_limit=None,
            trigger_mode="always_last",
        )
        m.chatbot.retry(self.regenerate, **QUICK).then(**w.follow)
        m.chatbot.edit(self.edit, inputs=m.msg, outputs=[c.title_box, m.msg], **QUICK).then(
            **w.follow
        )
        m.continue_btn.click(self.continue_reply, **QUICK).then(**w.follow)
        m.stop_btn.click(self.stop, inputs=c.clicked_at, js=STAMP_JS, **QUICK)
