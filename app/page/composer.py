"""The message box and the replies: Send, Stop, Continue, ↻ (regenerate) and ✎ (edit). Each
asks ReplyManager (app/chat/live.py) for a reply and returns at once; the follow renders it."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import gradio as gr

from minisgl_engine import GenerateRequest, SamplingParams

from ..chat.composing import branch_note, edit_text, with_attachments
from ..chat.live import Turn
from ..chat.settings_form import SettingsForm
from ..chat.store import NotFoundError, title_from
from ..chat.view import can_continue, engine_messages, typed_text
from . import toasts
from .scripts import SEND_JS, STAMP_JS, SYNC_SEND_JS
from .tabs import BUSY_HINT, Tab, TabState
from .wiring import QUICK, Wiring

DOUBLE_SEND_MS = (
    1000  # the same text sent again within this is a double click or Enter, not a second message
)
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


class Composer(TabState):
    """What the message box and the chat's own buttons ask of the replies."""

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
            params = SamplingParams(
                max_tokens=int(s.max_tokens),
                temperature=float(s.temperature),
                top_p=float(s.top_p),
                top_k=int(s.top_k) or -1,
                seed=s.seed,
                stop=list(s.stop),
                repetition_penalty=float(s.repetition_penalty),
            )
            kwargs = {"enable_thinking": bool(s.thinking)} if source.supports_thinking else {}
            messages = engine_messages(replace(conv, messages=path), s)
            if continue_id is not None:
                kwargs["continue_final_message"] = True
                last = path[-1]
                request = GenerateRequest(
                    params=params, messages=messages, chat_template_kwargs=kwargs
                )
                return Turn(
                    request,
                    last.id,
                    text=last.content,
                    earlier=last.stats,
                    backend=backend,
                    generate=source.generate,
                )
            request = GenerateRequest(
                params=params, messages=messages, chat_template_kwargs=kwargs or None
            )
            question = path[-1]
            if (
                question.stats is not None and question.stats.unanswered
            ):  # answered now (↻): its mark goes
                self.store.update_message(
                    question.id,
                    question.content,
                    replace(question.stats, unanswered=False).to_dict(),
                )
            reply = self.store.add_message(
                conv_id, question.id, "assistant", "", stats={"tokens": 0}, model=source.model_name
            )
            return Turn(
                request,
                reply.id,
                backend=backend,
                generate=source.generate,
                model_of=lambda: source.model_name,
            )

        return make_turn

    def submit(
        self,
        tab: Tab,
        conv_id: int,
        request: gr.Request,
        make_turn,
        clicked_at: float | None = None,
    ) -> None:
        """Start (or queue) a reply of ``conv_id`` for this tab; stopped at once if the tab's Stop
        was clicked after it (``clicked_at``, browser ms) but handled before it."""
        self.replies.submit(
            conv_id, request.session_hash if request is not None else None, make_turn
        )
        if clicked_at is not None and tab.events.early_stop > clicked_at:
            tab.events.early_stop = 0.0
            self.replies.stop(conv_id)

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
        if not text and (after_click or not tab.draft.attachments):
            return (
                sent,
                gr.skip(),
            )  # Enter on an empty box: nothing happens (nor after a click: not its files)
        sent_at = clicked_at if clicked_at is not None else time.time() * 1000
        last = tab.draft.last_send
        # either order: Gradio may start the second send of a double click before the first
        if (
            last is not None
            and last[:2] == (tab.conv_id, text)
            and abs(sent_at - last[2]) < DOUBLE_SEND_MS
        ):
            return (
                sent,
                gr.skip(),
            )  # the same message again at once: a double click or Enter, sent once
        conv = self.shown(tab)
        if not self.shows_current(tab, conv, appending=True):
            return (
                kept,
                gr.skip(),
            )  # the message goes back to the box; the page shows the chat as it is now
        # the settings boxes as Enter found them, saved first; after a click whose answer had not
        # come (``after_click``), they were still those of the chat shown before: that chat's, not saved here
        checked = self.checked_form(form, self.settings_of(tab, conv))
        if not after_click and not self.save_settings(tab, *checked):
            return kept, gr.skip()  # the toast says which setting; the message goes back to the box
        if not self.backend_of(self.settings_in_force(tab))[1].ready:
            toasts.warn(
                "The model is still loading; send your message once it has loaded (the status line stops saying Loading)."
            )
            return kept, gr.skip()
        raw_text, text = text, with_attachments(text, tab.draft.attachments)
        # A message sent to a chat that is not replying is answered on its own: the questions at
        # the chat's end that nothing answers (the chat stopped before their turn: Stop, a closed
        # tab, the app stopped) are marked as left unanswered, in the transaction that stores it,
        # so the model does not see them and they keep their mark (view.left_unanswered). Messages
        # sent while it replies are answered together by the reply after the last of them. (A
        # reply being stopped answers nothing more: ReplyManager.answers_later.)
        leave_unanswered = tab.conv_id is not None and not self.replies.answers_later(tab.conv_id)
        if (
            tab.conv_id is None
        ):  # the chat and its first message: one transaction, so a failure leaves no empty chat
            tab.conv_id = self.store.create(
                title=title_from(text), settings=tab.new_chat_settings, first_message=text
            ).id
            tab.picked = True
            if (
                tab.drawn.fields_shown is not None and tab.drawn.fields_shown[0] is None
            ):  # the boxes show its settings: its title
                tab.drawn.fields_shown = (
                    tab.conv_id,
                    tab.drawn.fields_shown[1],
                )  # box (empty) is redrawn, alone
        else:
            self.store.append(tab.conv_id, "user", text, leave_unanswered=leave_unanswered)
        tab.draft.attachments = []  # sent with the message: only now (a failed store keeps them attached)
        tab.draft.last_send = (tab.conv_id, raw_text, sent_at)
        tab.focus = None  # a message clicked above: the versions bar follows the new last turn
        self.submit(tab, tab.conv_id, request, self.turn_for(tab.conv_id), clicked_at)
        tab.drawn.status = self.status_of(tab)
        return sent, tab.drawn.status

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
        if (
            not first
            or conv.title != title_from(edited.content)
            or conv.title == title_from(new_text)
        ):
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
            send_btn = gr.Button(
                "Send", elem_id="send-btn", variant="primary", scale=1, min_width=80
            )
            stop_btn = gr.Button(
                "Stop", elem_id="stop-btn", variant="secondary", scale=1, min_width=80
            )
        return SimpleNamespace(attach_btn=attach_btn, msg=msg, send_btn=send_btn, stop_btn=stop_btn)

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
        m.chatbot.retry(self.regenerate, **QUICK).then(**w.follow)
        m.chatbot.edit(self.edit, inputs=m.msg, outputs=[c.title_box, m.msg], **QUICK).then(
            **w.follow
        )
        m.continue_btn.click(self.continue_reply, **QUICK).then(**w.follow)
        m.stop_btn.click(self.stop, inputs=c.clicked_at, js=STAMP_JS, **QUICK)
