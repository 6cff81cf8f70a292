"""Asking for a reply: the chat's next turn, made when it starts (after any reply before it in
the chat), and handed to ReplyManager (app/chat/live.py), which runs it apart from the page."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from minisgl_engine import GenerateRequest

from ..chat.live import Turn
from ..chat.reply_protocol import ReplySource
from ..chat.reply_request import answered_path, reply_request
from ..chat.store import Message
from .tabs import Tab, TabState


class ReplyTurns(TabState):
    """The turns that Send, ↻, Continue and ✎ ask for."""

    def turn_for(self, conv_id: int, after: int | None = None, continue_id: int | None = None):
        """The next reply of ``conv_id``, made when it starts (after any reply before it): a new
        reply to the shown chat's last message, a new version of the reply to ``after`` (a user
        message on the path), or more of reply ``continue_id``."""

        def make_turn() -> Turn | None:
            conv = self.store.get(conv_id)
            path = answered_path(conv, after, continue_id)
            if path is None:
                return None
            backend, source = self.backend_of(conv.settings)
            request = reply_request(conv, path, source, continuing=continue_id is not None)
            if continue_id is not None:
                last = path[-1]
                return Turn(
                    request,
                    last.id,
                    text=last.content,
                    earlier=last.stats,
                    backend=backend,
                    generate=source.generate,
                )
            return self.new_reply(conv_id, path[-1], request, backend, source)

        return make_turn

    def new_reply(
        self,
        conv_id: int,
        question: Message,
        request: GenerateRequest,
        backend: str,
        source: ReplySource,
    ) -> Turn:
        """A new reply to ``question``, stored empty in advance (the reply fills it); a question
        left unanswered is answered now (↻): its mark goes."""
        if question.stats is not None and question.stats.unanswered:
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
