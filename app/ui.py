"""The chat window (Gradio), mounted on the same FastAPI app as the OpenAI routes.

The UI talks to the engine only through the front end's ``FrontendClient.generate`` (the one
way in); conversations live in the SQLite :class:`~minisgl_app.store.ConversationStore`. A reply
streams token by token; Stop (or closing the tab) cancels the handler, which closes the engine
stream, and the engine aborts the request and frees its KV pages.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

import gradio as gr

from minisgl_engine.errors import UserError
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.server.openai_protocol import GenerateRequest

from .store import ChatSettings, ConversationStore, title_from

ASSETS = Path(__file__).resolve().parent.parent / "assets"
STORE_EVERY_S = 0.5  # how often a growing reply is written to the database
THINK_TAGS = [("<think>", "</think>")]


def format_stats(stats: dict | None) -> str:
    if not stats:
        return ""
    parts = []
    if stats.get("ttft_ms") is not None:
        parts.append(f"{stats['ttft_ms'] / 1000:.2f} s to first token")
    if stats.get("tok_s") is not None:
        parts.append(f"{stats['tok_s']:.1f} tok/s")
    if stats.get("tokens") is not None:
        parts.append(f"{stats['tokens']} tokens")
    if stats.get("stopped"):
        parts.append("stopped")
    elif stats.get("finish_reason") == "length":
        parts.append("hit the token limit")
    return " · ".join(parts)


def chat_messages(conv) -> list[dict]:
    """The conversation as the Chatbot shows it: a stats line under each finished reply."""
    out = []
    for m in conv.messages:
        if m.role == "system":
            continue
        content = m.content
        line = format_stats(m.stats.to_dict() if m.stats else None)
        if m.role == "assistant" and line:
            content = f"{content}\n\n<sub class=\"reply-stats\">{line}</sub>"
        out.append({"role": m.role, "content": content})
    return out


def engine_messages(conv, settings: ChatSettings) -> list[dict]:
    """What the model sees: the system prompt, then every stored turn."""
    msgs = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
    msgs += [{"role": m.role, "content": m.content} for m in conv.messages if m.role in ("user", "assistant")]
    return msgs


def status_line(client) -> str:
    if not client.ready:
        if client.startup_errors:
            worker, error = next(iter(client.startup_errors.items()))
            return f"**Error:** {worker} failed to start: {error}"
        done = len(client.worker_info)
        total = len(client.expected_workers)
        return f"**Starting** {client.model_name}: {client.phase}… ({done}/{total} engine processes ready)"
    sched = client.worker_info.get("minisgl-TP0-scheduler", {})
    s = client.stats
    kv = f"KV {s.kv_pages_used + s.kv_pages_cached}/{s.kv_pages_total} pages" if s else "KV –"
    running = f"{s.running} running, {s.waiting} waiting" if s else ""
    return f"**Ready** · {client.model_name} on {sched.get('device', '?')} ({sched.get('dtype', '?')}) · {kv} · {running}"


def conversation_choices(store: ConversationStore) -> list[tuple[str, int]]:
    return [(c.title, c.id) for c in store.list()]


def build_ui(client, store: ConversationStore) -> gr.Blocks:
    """The whole page. ``client`` is the engine's FrontendClient."""

    def settings_of(conv_id: int | None) -> ChatSettings:
        return store.get(conv_id).settings if conv_id is not None else store.default_settings()

    def settings_outputs(s: ChatSettings):
        return s.system_prompt, s.temperature, s.top_p, s.max_tokens, s.thinking

    # ---- conversations ------------------------------------------------------------------

    def load_page():
        convs = store.list()
        conv_id = convs[0].id if convs else None
        thinking_toggle = gr.update(visible=chat_template_supports_thinking(client.tokenizer_path))
        return (*show_conversation(conv_id), thinking_toggle, gr.update(label=client.model_name))

    def show_conversation(conv_id: int | None):
        msgs = chat_messages(store.get(conv_id)) if conv_id is not None else []
        title = store.get(conv_id).title if conv_id is not None else ""
        return (
            conv_id,
            gr.update(choices=conversation_choices(store), value=conv_id),
            msgs,
            title,
            *settings_outputs(settings_of(conv_id)),
        )

    def new_chat():
        return show_conversation(None)

    def rename(conv_id: int | None, title: str):
        if conv_id is None:
            gr.Warning("Start a chat first, then rename it.")
            return gr.update()
        title = title.strip()
        if not title:
            gr.Warning("A title cannot be empty.")
            return gr.update()
        store.rename(conv_id, title[:200])
        return gr.update(choices=conversation_choices(store), value=conv_id)

    def delete(conv_id: int | None):
        if conv_id is not None:
            store.delete(conv_id)
        return load_page()

    def export(conv_id: int | None, kind: str):
        if conv_id is None:
            gr.Warning("Nothing to export yet.")
            return None
        conv = store.get(conv_id)
        text = store.export_markdown(conv_id) if kind == "md" else store.export_json(conv_id)
        folder = Path(tempfile.mkdtemp(prefix="minisgl-export-"))
        safe = "".join(ch if ch.isalnum() or ch in "-_ " else "_" for ch in conv.title).strip() or "chat"
        path = folder / f"{safe}.{kind}"
        path.write_text(text, encoding="utf-8")
        return str(path)

    def save_settings(conv_id, system_prompt, temperature, top_p, max_tokens, thinking):
        settings = ChatSettings(system_prompt or "", temperature, top_p, max_tokens, bool(thinking))
        try:
            settings = validated(settings)
        except ValueError as exc:
            gr.Warning(f"Settings not saved: {exc}")
            return
        if conv_id is not None:
            store.update_settings(conv_id, settings)
        gr.Info("Settings saved." if conv_id is not None else "Settings will apply to the next chat you start.")

    # ---- one reply ------------------------------------------------------------------------

    reply_locks: dict[int, asyncio.Lock] = {}  # one per conversation replied to (a few bytes each)
    replies_due: dict[str, int] = {}  # per browser session: messages stored whose reply has not started
    stop_signals: dict[str, set[asyncio.Event]] = {}  # per browser session: one per reply started, until it ends

    async def respond(conv_id, system_prompt, temperature, top_p, max_tokens, thinking, request: gr.Request):
        """Stream the assistant's reply to the last user message of ``conv_id``. One reply at a
        time per conversation: a message sent while a reply streams (or while a stopped one is
        still being cancelled) is answered after it, to the whole stored conversation."""
        stop = asyncio.Event()
        session = request.session_hash if request is not None else None
        stop_signals.setdefault(session, set()).add(stop)
        _reply_started(request)
        try:
            async with reply_locks.setdefault(conv_id, asyncio.Lock()):
                if stop.is_set():  # Stop was clicked while this reply waited for the previous one
                    return
                async with aclosing(_respond(conv_id, stop)) as replies:
                    async for shown in replies:
                        yield shown
        finally:
            stop_signals[session].discard(stop)
            if not stop_signals[session]:
                del stop_signals[session]

    def _reply_due(request: gr.Request | None) -> None:
        if request is not None and request.session_hash:
            replies_due[request.session_hash] = replies_due.get(request.session_hash, 0) + 1

    def _reply_started(request: gr.Request | None) -> None:
        if request is not None and request.session_hash and replies_due.get(request.session_hash, 0) > 0:
            replies_due[request.session_hash] -= 1
            if not replies_due[request.session_hash]:
                del replies_due[request.session_hash]

    async def _respond(conv_id, stop: asyncio.Event):
        conv = store.get(conv_id)
        settings = conv.settings
        try:
            params = SamplingParams(
                max_tokens=int(settings.max_tokens), temperature=float(settings.temperature), top_p=float(settings.top_p)
            )
        except UserError as exc:
            gr.Warning(str(exc))
            return
        kwargs = {"enable_thinking": bool(settings.thinking)} if chat_template_supports_thinking(client.tokenizer_path) else None
        request = GenerateRequest(params=params, messages=engine_messages(conv, settings), chat_template_kwargs=kwargs)
        reply = store.append(conv_id, "assistant", "", stats={"tokens": 0})
        text, tokens, finish, error = "", 0, None, None
        start = time.perf_counter()
        first = None
        last_store = start
        stopped = True  # until the engine says the reply is complete
        shown = chat_messages(conv) + [{"role": "assistant", "content": ""}]

        def stats() -> dict:
            now = time.perf_counter()
            ttft = (first - start) * 1000 if first else None
            rate = (tokens - 1) / (now - first) if first and tokens > 1 and now > first else None
            return {"ttft_ms": ttft, "tok_s": rate, "tokens": tokens, "finish_reason": finish, "stopped": stopped and finish is None}

        try:
            async for out in client.generate(request, stop):
                if out.error:
                    error = out.error
                    break
                if out.incremental_output:
                    if first is None:
                        first = time.perf_counter()
                    text += out.incremental_output
                tokens = out.completion_tokens
                if out.finished:
                    finish = out.finish_reason
                    stopped = False
                shown[-1] = {"role": "assistant", "content": text}
                now = time.perf_counter()
                if now - last_store > STORE_EVERY_S:
                    store.update_message(reply.id, text, stats())
                    last_store = now
                yield shown
        finally:
            # Runs on completion, on Stop (the task is cancelled) and when the tab goes away:
            # what was shown is what is stored.
            if error is not None:
                # the engine refused this turn (e.g. too long): forget it, so the conversation
                # stays usable; the page still shows the message and why it failed
                store.truncate_after(conv_id, reply.position - 2)
            else:
                store.update_message(reply.id, text, stats())
        if error is not None:
            gr.Warning(error)
            shown[-1] = {"role": "assistant", "content": f"⚠️ {error}"}
            yield shown
            return
        shown[-1] = {"role": "assistant", "content": f"{text}\n\n<sub class=\"reply-stats\">{format_stats(stats())}</sub>"}
        yield shown

    def add_user_message(conv_id, text: str, system_prompt, temperature, top_p, max_tokens, thinking,
                         request: gr.Request):
        """Store the user's message (starting a conversation if needed); clear the box."""
        text = (text or "").strip()
        if not text:
            raise gr.Error("Type a message first.", print_exception=False)
        if conv_id is None:
            try:
                settings = validated(ChatSettings(system_prompt or "", temperature, top_p, max_tokens, bool(thinking)))
            except ValueError as exc:
                raise gr.Error(f"Check the settings: {exc}", print_exception=False) from None
            conv_id = store.create(title=title_from(text), settings=settings).id
        store.append(conv_id, "user", text)
        _reply_due(request)
        conv = store.get(conv_id)
        return conv_id, "", chat_messages(conv), gr.update(choices=conversation_choices(store), value=conv_id)

    def prepare_retry(conv_id, request: gr.Request):
        """Regenerate: drop the last reply, keep the user message."""
        conv = store.get(conv_id)
        last_user = max((m.position for m in conv.messages if m.role == "user"), default=None)
        if last_user is None:
            raise gr.Error("Nothing to regenerate.", print_exception=False)
        store.truncate_after(conv_id, last_user)
        _reply_due(request)
        return chat_messages(store.get(conv_id))

    def prepare_edit(conv_id, edit: gr.EditData, request: gr.Request):
        """Edit-and-resend: only the last user message can be edited; later turns are dropped."""
        conv = store.get(conv_id)
        visible = [m for m in conv.messages if m.role != "system"]
        target = visible[edit.index] if 0 <= edit.index < len(visible) else None
        last_user = max((m.position for m in conv.messages if m.role == "user"), default=None)
        if target is None or target.role != "user" or target.position != last_user:
            raise gr.Error("Only your last message can be edited and sent again.", print_exception=False)
        new_text = edit.value if isinstance(edit.value, str) else str(edit.value)
        store.truncate_after(conv_id, target.position - 1)
        store.append(conv_id, "user", new_text.strip())
        _reply_due(request)
        return chat_messages(store.get(conv_id))

    def refresh_list(conv_id):
        return gr.update(choices=conversation_choices(store), value=conv_id)

    async def stop_replies(request: gr.Request):
        """Stop: end every reply of this browser session, on the server. (Gradio then also
        cancels the tab's reply events, but only those the page already knows as started: a
        reply whose message was sent just before Stop could run on.) A message stored but whose
        reply has not started yet is waited for (at most 5 s), so that it is stopped too."""
        deadline = time.monotonic() + 5.0
        while replies_due.get(request.session_hash, 0) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for stop in stop_signals.get(request.session_hash, ()):
            stop.set()

    def show_stored(conv_id, shown):
        """After a reply was stopped: the tab's conversation as stored (the stopped reply with its
        stats line). Runs once the cancelled handler has written it, for the conversation the tab
        shows by then; nothing if the tab has moved on to a new chat."""
        if conv_id is None or not shown:
            return gr.skip()
        return chat_messages(store.get(conv_id))

    # ---- layout ---------------------------------------------------------------------------

    with gr.Blocks(title="minisgl-chat", fill_height=True) as demo:
        conv_state = gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=220, elem_id="sidebar"):
                new_btn = gr.Button("＋ New chat", elem_id="new-chat-btn", variant="secondary")
                conv_list = gr.Radio(choices=[], label="Conversations", elem_id="conv-list", interactive=True)
                with gr.Accordion("Manage", open=False):
                    title_box = gr.Textbox(label="Title", elem_id="title-input", max_lines=1)
                    rename_btn = gr.Button("Rename", elem_id="rename-btn", size="sm")
                    delete_btn = gr.Button("Delete chat", elem_id="delete-btn", size="sm", variant="stop")
                    export_md = gr.DownloadButton("Export Markdown", elem_id="export-md-btn", size="sm")
                    export_json = gr.DownloadButton("Export JSON", elem_id="export-json-btn", size="sm")
                with gr.Accordion("Settings", open=False, elem_id="settings"):
                    d = store.default_settings()
                    system_box = gr.Textbox(label="System prompt", value=d.system_prompt, lines=3, elem_id="system-prompt")
                    temperature = gr.Number(label="Temperature (0 = greedy, up to 2)", value=d.temperature, elem_id="temperature")
                    top_p = gr.Number(label="Top-p (0–1]", value=d.top_p, elem_id="top-p")
                    max_tokens = gr.Number(label="Max tokens", value=d.max_tokens, precision=0, elem_id="max-tokens")
                    thinking = gr.Checkbox(label="Thinking mode", value=d.thinking, visible=False, elem_id="thinking")
                    save_btn = gr.Button("Save settings", elem_id="save-settings-btn", size="sm")
            with gr.Column(scale=4, elem_id="main"):
                status = gr.Markdown(status_line(client), elem_id="status-line")
                chatbot = gr.Chatbot(
                    elem_id="chatbot",
                    label=client.model_name,
                    height="70vh",
                    editable="user",
                    reasoning_tags=THINK_TAGS,
                    buttons=["copy"],
                    placeholder="Ask anything. Replies stream in; **Stop** ends one at once.",
                    feedback_options=None,
                )
                with gr.Row():
                    msg = gr.Textbox(
                        show_label=False, placeholder="Message (Enter sends, Shift+Enter for a new line)",
                        elem_id="msg-input", scale=8, lines=1, max_lines=8, autofocus=True,
                    )
                    send_btn = gr.Button("Send", elem_id="send-btn", variant="primary", scale=1, min_width=80)
                    stop_btn = gr.Button("Stop", elem_id="stop-btn", variant="stop", scale=1, min_width=80)
        timer = gr.Timer(1.0)

        settings_inputs = [system_box, temperature, top_p, max_tokens, thinking]
        page_outputs = [conv_state, conv_list, chatbot, title_box, *settings_inputs]
        reply_inputs = [conv_state, *settings_inputs]

        demo.load(load_page, outputs=[*page_outputs, thinking, chatbot], queue=False)
        timer.tick(lambda: status_line(client), outputs=status, queue=False, show_progress="hidden")
        new_btn.click(new_chat, outputs=page_outputs, queue=False)
        conv_list.input(show_conversation, inputs=conv_list, outputs=page_outputs, queue=False)
        rename_btn.click(rename, inputs=[conv_state, title_box], outputs=conv_list)
        delete_btn.click(delete, inputs=conv_state, outputs=page_outputs)
        export_md.click(lambda c: export(c, "md"), inputs=conv_state, outputs=export_md)
        export_json.click(lambda c: export(c, "json"), inputs=conv_state, outputs=export_json)
        save_btn.click(save_settings, inputs=[conv_state, *settings_inputs])

        # trigger_mode "multiple": with Gradio's default ("once") the page silently skips a reply
        # whose previous run is still pending, e.g. one being cancelled by Stop while the next
        # message is sent; respond itself answers one message at a time per conversation.
        reply_event = dict(fn=respond, inputs=reply_inputs, outputs=chatbot, concurrency_limit=None,
                           show_progress="hidden", trigger_mode="multiple")
        # queue=False: a message is stored the moment it arrives, never behind a queue, so a
        # Stop clicked right after it finds its reply due and stops it (stop_replies).
        sends = [trigger(add_user_message, inputs=[conv_state, msg, *settings_inputs],
                         outputs=[conv_state, msg, chatbot, conv_list], show_progress="hidden", queue=False)
                 for trigger in (msg.submit, send_btn.click)]
        replies = [send.success(**reply_event) for send in sends]
        replies.append(chatbot.retry(prepare_retry, inputs=conv_state, outputs=chatbot, queue=False).success(**reply_event))
        replies.append(chatbot.edit(prepare_edit, inputs=conv_state, outputs=chatbot, queue=False).success(**reply_event))
        # Stop ends the reply at once: cancelling the handler closes the engine stream (abort).
        # The page cancels only after stop_replies has returned (Gradio runs an event's own
        # function before the cancellation it asks for).
        stop_btn.click(stop_replies, cancels=replies, queue=False)
        chatbot.clear(new_chat, outputs=page_outputs, queue=False)  # the chat's own trash icon: a fresh chat
        for event in replies:
            event.failure(show_stored, inputs=[conv_state, chatbot], outputs=chatbot, queue=False)  # stopped: its stats line
            event.then(refresh_list, inputs=conv_state, outputs=conv_list, queue=False)
    return demo


def validated(settings: ChatSettings) -> ChatSettings:
    """Coerce the form's numbers, then apply the store's own checks."""
    try:
        settings = ChatSettings(
            system_prompt=settings.system_prompt,
            temperature=float(settings.temperature),
            top_p=float(settings.top_p),
            max_tokens=int(settings.max_tokens) if float(settings.max_tokens).is_integer() else settings.max_tokens,
            thinking=settings.thinking,
        )
    except (TypeError, ValueError):
        raise ValueError("temperature, top-p and max tokens must be numbers") from None
    settings.validate()
    return settings


def chat_template_supports_thinking(tokenizer_path: str | None) -> bool:
    """Qwen3-style templates read an `enable_thinking` variable; others ignore the toggle."""
    if tokenizer_path is None:
        return False
    folder = Path(tokenizer_path)
    texts = [p.read_text(errors="ignore") for p in (folder / "chat_template.jinja", folder / "tokenizer_config.json") if p.exists()]
    return any("enable_thinking" in t for t in texts)


def theme_css() -> str:
    path = ASSETS / "theme.css"
    return path.read_text() if path.exists() else ""


def mount_ui(app, client, store: ConversationStore, api_key: str | None) -> None:
    """Serve the chat at ``/`` of the engine's FastAPI app. Off loopback, the page asks for
    the API key (any user name, the key as password)."""
    import hmac

    demo = build_ui(client, store)
    demo.queue(default_concurrency_limit=None)
    # The page's events are its internals, not an API (docs/security.md): none is listed by
    # /gradio_api/info, and the routes that call them by name are refused (server/security.py).
    for fn in demo.fns.values():
        fn.api_visibility = "private"
    auth = None
    if api_key:
        def auth(_user: str, password: str) -> bool:
            return hmac.compare_digest(password.encode(), api_key.encode())

    favicon = ASSETS / "favicon.png"
    gr.mount_gradio_app(
        app,
        demo,
        path="/",
        auth=auth,
        auth_message="Enter any user name and this server's API key." if api_key else None,
        favicon_path=str(favicon) if favicon.exists() else None,
        footer_links=[],
        run_history=False,  # Gradio would keep a copy of each event's output (the chats) in the browser
        css=theme_css(),
        theme=gr.themes.Soft(),
        ssr_mode=False,
    )


__all__ = ["build_ui", "mount_ui"]
