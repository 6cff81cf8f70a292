"""Asking for a reply: the chat's next turn, made when it starts (after any reply before it in
the chat), and handed to ReplyManager (app/chat/live.py), which runs it apart from the page."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from minisgl_engine import GenerateRequest

from ..chat.context_fit import ContextOverflow
from ..chat.live import Turn
from ..chat.reply_protocol import ReplySource
from ..chat.reply_request import answered_path, fitted_request, reply_request, tool_loop_for
from ..chat.store import DROP_OLDEST, Conversation, Message, MessageStats
from ..chat.tool_loop import ToolBox, ToolLoop
from .tabs import Tab, TabState


class ReplyTurns(TabState):
    """The turns that Send, ↻, Continue and ✎ ask for."""

    toolbox: ToolBox  # the MCP servers running now (tools_panel.py)

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
            loop = None
            if continue_id is None:  # a chat with tools: the model reads their earlier calls
                request, loop = tool_loop_for(conv, path, request, self.toolbox, source)
            request, read_from = self.fitted(conv, path, request, source, continue_id is None, loop)
            if continue_id is not None:
                last = path[-1]
                return Turn(
                    request,
                    last.id,
                    text=last.content,
                    earlier=last.stats,
                    backend=backend,
                    generate=source.generate,
                    read_from=read_from,
                )
            turn = self.new_reply(conv_id, path[-1], request, backend, source, read_from)
            return replace(turn, tool_loop=loop)  # the reply runs its loop

        return make_turn

    def fitted(
        self,
        conv: Conversation,
        path: list[Message],
        request,
        source,
        answering: bool,
        loop: ToolLoop | None = None,
    ) -> tuple[GenerateRequest, int | None]:
        """The request fitted into the model's context under the chat's policy (↻ on a question
        that the "stop" policy left: the oldest turns dropped, once). A chat that cannot be sent
        raises ContextOverflow, which ReplyManager says in a toast; its question is left
        unanswered and marked so (view.OVER_CONTEXT_LINE, when dropping turns would help)."""
        question = path[-1]
        over = answering and question.stats is not None and question.stats.over_context
        policy = DROP_OLDEST if over else conv.settings.context_policy
        try:
            return fitted_request(conv, path, request, source, policy, loop)
        except ContextOverflow as exc:
            if answering:
                stats = question.stats or MessageStats()
                mark = replace(
                    stats,
                    unanswered=True,
                    over_context=exc.prompt_tokens if exc.droppable else None,
                )
                self.store.update_message(question.id, question.content, mark.to_dict())
            raise

    def new_reply(
        self,
        conv_id: int,
        question: Message,
        request: GenerateRequest,
        backend: str,
        source: ReplySource,
        read_from: int | None = None,
    ) -> Turn:
        """A new reply to ``question``, stored empty in advance (the reply fills it); a question
        left unanswered is answered now (↻): its mark goes. ``read_from``: the first message the
        model reads, when the oldest turns were dropped to fit the context."""
        if question.stats is not None and question.stats.unanswered:
            self.store.update_message(
                question.id,
                question.content,
                replace(question.stats, unanswered=False, over_context=None).to_dict(),
            )
        reply = self.store.add_message(
            conv_id,
            question.id,
            "assistant",
            "",
            stats={"tokens": 0, "read_from": read_from},
            model=source.model_name,
        )
        return Turn(
            request,
            reply.id,
            backend=backend,
            generate=source.generate,
            model_of=lambda: source.model_name,
            read_from=read_from,
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
