"""``minisgl-chat --remote URL``: the chat page with no engine of its own.

The same page, store and security as the local app (Host/Origin guard, the page key,
loopback by default); its replies come from a remote OpenAI-compatible server
through :class:`~.reply_source.RemoteEngine`. No model is loaded and no engine process runs
here, so this starts in seconds on any machine."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

from minisgl_engine import ServerConfig, bind_listen_socket, check_server_config

from .chat.reply_source import RemoteEngine
from .chat.store import ConversationStore


def run_remote_chat(
    remote: RemoteEngine,
    server: ServerConfig,
    store: ConversationStore,
    on_listen: Callable[[str], None],
    page_key: str | None,
) -> int:
    """Serve the page until SIGINT/SIGTERM (exit 0: an orderly stop)."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from minisgl_engine import install_guard

    from .page import mount_ui

    check_server_config(server)
    listen_socket = bind_listen_socket(server.host, server.port)
    app = FastAPI(title="minisgl-chat", docs_url=None, redoc_url=None, openapi_url=None)
    install_guard(app, server.access_policy())

    @app.get("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        return JSONResponse(
            {"status": "ok"}
        )  # not the remote's address: /health is outside the login wall

    mount_ui(app, remote, store, server.api_key, page_key=page_key)
    host = f"[{server.host}]" if ":" in server.host else server.host
    url = f"http://{host}:{listen_socket.getsockname()[1]}"
    http = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
    )

    call_exit_hooks_on_stop(http, app)

    async def main() -> None:
        await remote.check()  # the first status line already says whether the remote answers
        print(
            f"minisgl-chat: ready at {url} ({remote.status_line().replace('**', '')})",
            file=sys.stderr,
            flush=True,
        )
        on_listen(url)
        try:
            await http.serve(sockets=[listen_socket])
        finally:
            await remote.close()

    signal.signal(
        signal.SIGTERM, signal.default_int_handler
    )  # uvicorn installs its own once serving
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        listen_socket.close()
    return 0


def call_exit_hooks_on_stop(http, app) -> None:
    """When ``http`` (a uvicorn.Server) begins to stop, also run ``app.state.exit_hooks`` (the
    page's: page/mount.py), as engine/api/server.py does for the engine's server."""
    uvicorn_handle_exit = http.handle_exit

    def handle_exit(sig: int, frame: object) -> None:
        uvicorn_handle_exit(sig, frame)
        loop = asyncio.get_running_loop()
        for hook in getattr(app.state, "exit_hooks", ()):
            loop.call_soon_threadsafe(hook)

    http.handle_exit = handle_exit
