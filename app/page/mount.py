"""The page served on a FastAPI app: Gradio mounted at ``/``, its queue tuned
(gradio_patches.py), and the page's guards around it: the login wall (access.py), the
Content-Security-Policy (csp.py), the early answer for an event stream of a gone session and
the beacon of a tab that goes."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

import gradio as gr

from ..chat.reply_source import ReplySource
from ..chat.store import ConversationStore
from ..chat.uploads import UPLOAD_LIMIT_BYTES
from ..model_pull import ModelPuller
from .access import PageGuard
from .csp import page_csp
from .css import PAGE_CSS
from .gradio_patches import keep_session_queues, quiet_queue
from .scripts import PAGE_JS, TAB_CLOSED_PATH
from .ui import chat_page

STATIC = (
    Path(__file__).resolve().parents[1] / "static"
)  # the page's theme and favicon, inside the package (and its wheel)


def theme_css() -> str:
    """The page's look (static/theme.css) and the CSS it needs to behave (page/css.py)."""
    return (STATIC / "theme.css").read_text() + PAGE_CSS


class StreamOfGoneSession:
    """Answers 404 at once to a page's event stream (``GET .../queue/data``) for a session with
    nothing pending, as Gradio does, but before the response has started: Gradio (6.x) finds that
    out inside the stream, after sending 200, and the server logs a Traceback ("response already
    started"): a stream for a session never seen, or one that Gradio's bounded cache let go
    (keep_session_queues). ``queue``: the Blocks' queue (not public API: without it, no check)."""

    def __init__(self, app, queue) -> None:
        self.app, self.queue = app, queue

    async def __call__(self, scope, receive, send) -> None:
        pending = getattr(self.queue, "pending_messages_per_session", None)
        if (
            scope["type"] == "http"
            and scope["path"].endswith("/queue/data")
            and pending is not None
        ):
            session = (
                parse_qs(scope.get("query_string", b"").decode()).get("session_hash") or [""]
            )[0]
            if session not in pending:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 404,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"detail":"Not Found"}'})
                return
        await self.app(scope, receive, send)


class TabClosedBeacon:
    """Takes a page's beacon as its tab goes (``POST /tab-closed``: the tab's Gradio session in
    its body: page.js, sayWhenTheTabGoes) and closes that tab (``close``: TabState.tab_closed),
    answering 204. It stands for Gradio's heartbeat stream, which each tab held open to say the
    same by closing it: a seventh tab of the app in one browser then never loaded (Chromium opens
    six connections per host). Inside the page's guards: only the page's own browser sends it."""

    def __init__(self, app, close) -> None:
        self.app, self.close = app, close

    async def __call__(self, scope, receive, send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].endswith("/" + TAB_CLOSED_PATH)
        ):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more and len(body) <= 200:  # a session is a dozen characters
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        session = body[:200].decode("utf-8", "replace").strip()
        if session:
            self.close(session)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def end_streams_on_exit(app, gradio_app, stop_replies) -> None:
    """As the server begins to stop (it calls ``app.state.exit_hooks``: engine/api/server.py,
    remote_app.py), the replies in flight end as stopped (``stop_replies``: their text kept, not
    an error), and so does any heartbeat stream of Gradio's (the page opens none: a page from
    before TabClosedBeacon may): those end only when the Gradio app's ``stop_event`` is set,
    which ``Blocks.close`` does for a launched app but nothing does for a mounted one, so the
    server waited for them and then cancelled them, logging a traceback per tab."""
    hooks = getattr(app.state, "exit_hooks", None)
    if hooks is None:
        hooks = app.state.exit_hooks = []
    hooks += [stop_replies, gradio_app.stop_event.set]


def mount_ui(
    app,
    source: ReplySource,
    store: ConversationStore,
    api_key: str | None,
    puller: ModelPuller | None = None,
    page_key: str | None = None,
) -> None:
    """Serve the chat at ``/`` of ``app`` (the engine's FastAPI app, or the remote mode's own).
    With ``page_key`` (access.py) every page route needs it (its cookie, or a login with it or
    with ``api_key``); None (``--no-auth``) leaves the page open to whoever reaches the server."""
    from starlette.routing import Mount

    page_state = chat_page(source, store, puller)
    demo = page_state.build()
    demo.queue(default_concurrency_limit=None)
    quiet_queue(demo)
    keep_session_queues(demo)
    # The page's events are its internals, not an API (docs/security.md): none is listed by
    # /gradio_api/info, and the routes that call them by name are refused (engine/api/security.py).
    for fn in demo.fns.values():
        fn.api_visibility = "private"
    favicon = STATIC / "favicon.png"
    gr.mount_gradio_app(
        app,
        demo,
        path="/",
        favicon_path=str(favicon) if favicon.exists() else None,
        footer_links=[],
        run_history=False,  # Gradio would keep a copy of each event's output (the chats) in the browser
        css=theme_css(),
        js=PAGE_JS,
        theme=gr.themes.Soft(),
        ssr_mode=False,
        max_file_size=UPLOAD_LIMIT_BYTES,  # the largest file the page takes (an import); larger uploads are refused as they come
    )
    # inside the server's own guards (engine/api/security.py: a foreign Host is refused first)
    page = next(route for route in reversed(app.routes) if isinstance(route, Mount))
    end_streams_on_exit(app, page.app, page_state.replies.stop_for_exit)
    app.state.exit_hooks.append(page_state.close_tools_soon)  # MCP servers end with the app
    page.app = StreamOfGoneSession(page.app, getattr(demo, "_queue", None))
    page.app = TabClosedBeacon(page.app, page_state.tab_closed)
    if page_key is not None:
        page.app = PageGuard(page.app, page_key, api_key)
    page.app = page_csp(page.app)  # outermost of the page's: its login form too
