"""The chat page belongs to the user who started the app (docs/security.md).

Every program on the machine can reach ``127.0.0.1:1919``, other users' programs included, and the
page's events can be called by index with any made-up session: without a secret they could read,
rename and delete every chat. So, as Jupyter does, the app keeps a **page key** (made once,
stored in the user's private data folder) and serves its page only to a browser that shows it:

- the browser the app opens gets the key in its link (``/?token=KEY``, through a private
  redirect file so the key never appears on a command line that ``ps`` shows); the terminal
  prints the same link;
- the answer to that link sets an HttpOnly cookie with the key and redirects to the address
  without it; later requests carry the cookie;
- without it, every page route (the page, Gradio's config, queue, uploads, files, events) answers
  401: a login form for a browser, one JSON line for anything else. The form takes the page key
  or, when the server has one, the API key (how someone on the LAN logs in); wrong keys are
  rate-limited.

``/v1``, ``/metrics`` and ``/health`` are not page routes: they keep the rules of a local
inference server (open on loopback, ``--api-key`` elsewhere). ``--no-auth`` drops the key, on
loopback only.
"""

from __future__ import annotations

import hmac
import html
import json
import os
import secrets
import time
from collections import deque
from importlib.resources import files
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

PAGE_KEY_FILE = "page-key"  # in the app's data folder (0700), itself 0600
OPEN_FILE = "open-page.html"  # the redirect file the browser is opened on
TOKEN_PARAM = "token"
LOGIN_PATH = "/page-login"
# The web app manifest the page links to (Gradio's <link rel="manifest">): a browser fetches it
# without cookies, so the key's check refused it ("Manifest fetch ... failed, code 401" in the
# console at every load). Answered to anyone, as it says nothing but the app's name.
MANIFEST_PATH = "/manifest.json"
MANIFEST = json.dumps({"name": "minisgl-chat", "start_url": "./", "display": "standalone"}).encode()
COOKIE_MAX_AGE_S = (
    180 * 24 * 3600
)  # the key stays until its file is deleted; so may the browser's cookie
MAX_LOGIN_BODY = 4096
MAX_FAILED_LOGINS = (
    10  # wrong keys (form or link) within FAILED_LOGIN_WINDOW_S, then 429 until the window passes
)
FAILED_LOGIN_WINDOW_S = 60.0


def load_page_key(folder: Path) -> str:
    """The app's page key: read from ``folder/page-key``, made there (0600) the first time. The same
    key across restarts keeps open tabs and bookmarks working; deleting the file makes a new one."""
    path = folder / PAGE_KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)  # an existing file with a looser mode, too
        key = path.read_text().strip()
        if len(key) >= 32:
            return key
        path.unlink()  # empty or cut short: make a new one
        return load_page_key(folder)
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def page_link(url: str, key: str | None) -> str:
    """The address that opens the page logged in (``url`` is the server's ``http://host:port``)."""
    return f"{url}/" if key is None else f"{url}/?{TOKEN_PARAM}={key}"


def write_open_file(folder: Path, link: str) -> Path:
    """A private HTML file (0600) that sends the browser on to ``link``: what the app opens, so
    that the key is not in the browser's command line (readable by every user through /proc)."""
    path = folder / OPEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.chmod(path, 0o600)
    target = html.escape(link, quote=True)
    with os.fdopen(fd, "w") as f:
        f.write(
            f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={target}">'
            f'<title>minisgl-chat</title><p><a href="{target}">Open the chat</a></p>\n'
        )
    return path


def cookie_name(scope: Scope) -> str:
    """Cookies are per host, not per port: each server's cookie is named after its port."""
    server = scope.get("server") or ("", 0)
    return f"minisgl-page-{server[1]}"


class FailedLogins:
    """Wrong keys within the last window, for the whole server (another local user may come from
    many addresses): past MAX_FAILED_LOGINS, keys are not even checked until the window moves on."""

    def __init__(
        self, limit: int = MAX_FAILED_LOGINS, window_s: float = FAILED_LOGIN_WINDOW_S
    ) -> None:
        self.limit, self.window_s = limit, window_s
        self.times: deque[float] = deque()

    def wait_s(self) -> float:
        """Seconds until a key may be tried again; 0 when it may now."""
        now = time.monotonic()
        while self.times and now - self.times[0] > self.window_s:
            self.times.popleft()
        return 0.0 if len(self.times) < self.limit else self.window_s - (now - self.times[0])

    def add(self) -> None:
        self.times.append(time.monotonic())


class PageGuard:
    """ASGI wrapper of the page's mount: lets through requests that carry the page key's cookie,
    logs browsers in, and refuses everything else with 401."""

    def __init__(self, app: ASGIApp, page_key: str, api_key: str | None = None) -> None:
        self.app = app
        self.keys = [page_key.encode()] + ([api_key.encode()] if api_key else [])
        self.page_key = page_key
        self.says_api_key = api_key is not None
        self.failed = FailedLogins()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.has_cookie(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send(
                {"type": "websocket.close", "code": 1008, "reason": "the chat page needs its key"}
            )
            return
        method, path = scope["method"], scope["path"]
        if path == MANIFEST_PATH and method in ("GET", "HEAD"):
            await respond(send, 200, "application/manifest+json", MANIFEST)
            return
        if path == LOGIN_PATH and method == "POST":
            await self.login_form(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        token = next((value for name, value in query if name == TOKEN_PARAM), None)
        if token is not None and method in ("GET", "HEAD"):
            await self.login_link(
                scope, send, token, [(n, v) for n, v in query if n != TOKEN_PARAM]
            )
            return
        await self.refuse(scope, send, "")

    def has_cookie(self, scope: Scope) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"cookie"), None)
        if header is None:
            return False
        value = cookie_parser(header.decode("latin-1")).get(cookie_name(scope))
        return value is not None and hmac.compare_digest(value.encode(), self.page_key.encode())

    def key_is_right(self, key: str) -> bool:
        """The page key, or the API key unless wrong keys are being tried (FailedLogins): the page
        key is 256 random bits, which no number of tries finds, so its owner is never locked out;
        an API key is chosen by a person and may be guessable."""
        given = key.strip().encode()
        if hmac.compare_digest(given, self.keys[0]):
            return True
        return self.failed.wait_s() == 0 and any(
            hmac.compare_digest(given, k) for k in self.keys[1:]
        )

    async def login_link(
        self, scope: Scope, send: Send, token: str, rest: list[tuple[str, str]]
    ) -> None:
        if not self.key_is_right(token):
            await self.wrong_key(
                scope,
                send,
                "That link's key is not this app's: open the link the app printed when it started.",
            )
            return
        where = scope.get("root_path", "") + scope["path"] + (f"?{urlencode(rest)}" if rest else "")
        await self.logged_in(scope, send, where)

    async def login_form(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_LOGIN_BODY:
                await self.refuse(scope, send, "That was not a key.")
                return
            if not message.get("more_body"):
                break
        form = dict(parse_qsl(body.decode("utf-8", "replace")))
        if not self.key_is_right(form.get("key", "")):
            await self.wrong_key(scope, send, "That key is not right.", form.get("next", "/"))
            return
        await self.logged_in(scope, send, safe_next(form.get("next", "/")))

    async def wrong_key(
        self, scope: Scope, send: Send, problem: str, next_path: str | None = None
    ) -> None:
        """401 with ``problem``, counted; 429 while too many wrong keys were tried (counted no more)."""
        wait = self.failed.wait_s()
        if not wait:
            self.failed.add()
            await self.refuse(scope, send, problem, next_path)
            return
        seconds = max(1, round(wait))
        problem = f"Too many wrong keys were tried: wait {seconds} s, or open the link the app printed (it always works)."
        await self.refuse(
            scope,
            send,
            problem,
            next_path,
            status=429,
            headers=[(b"retry-after", str(seconds).encode())],
            code="too_many_logins",
        )

    async def logged_in(self, scope: Scope, send: Send, where: str) -> None:
        cookie = (
            f"{cookie_name(scope)}={self.page_key}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; "
            "SameSite=Lax"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", where.encode("latin-1", "replace")),
                    (b"set-cookie", cookie.encode()),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    async def refuse(
        self,
        scope: Scope,
        send: Send,
        problem: str,
        next_path: str | None = None,
        status: int = 401,
        headers: list[tuple[bytes, bytes]] | None = None,
        code: str = "page_key_required",
    ) -> None:
        """401 (or ``status``): the login form for a browser asking for a page, saying ``problem``;
        one JSON line for anything else."""
        accept = next((v for k, v in scope.get("headers", ()) if k == b"accept"), b"").decode(
            "latin-1"
        )
        if scope["method"] in ("GET", "POST") and "text/html" in accept:
            query = urlencode(
                [
                    (n, v)
                    for n, v in parse_qsl(
                        scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
                    )
                    if n != TOKEN_PARAM
                ]
            )
            where = (
                next_path
                if next_path is not None
                else scope["path"] + (f"?{query}" if query else "")
            )
            page = login_page(problem, safe_next(where), self.says_api_key)
            await respond(send, status, "text/html; charset=utf-8", page.encode(), headers)
            return
        message = (
            problem
            or "this chat page belongs to the user who started minisgl-chat: open the link it printed (…/?token=…)"
        )
        kind = "rate_limited" if status == 429 else "unauthorized"
        await respond(send, status, "application/json", error_body(message, kind, code), headers)


def error_body(message: str, kind: str, code: str) -> bytes:
    """One error in OpenAI's shape, as the server's other refusals."""
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}
    ).encode()


async def respond(
    send: Send,
    status: int,
    content_type: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def safe_next(where: str) -> str:
    """A path on this server to go to after the login; anything else (another site) is ``/``."""
    if not where.startswith("/") or where.startswith("//") or "\\" in where or LOGIN_PATH in where:
        return "/"
    return where


# The login page's CSS (static/login.css), written into the page: a browser without the key is served no other file
LOGIN_CSS = (files("minisgl_app") / "static" / "login.css").read_text(encoding="utf-8")


def login_page(problem: str, next_path: str, takes_api_key: bool) -> str:
    """The page a browser without the key gets: what this is and how to get in. (Its referrer
    policy: under the server's ``no-referrer`` a browser posts the form with ``Origin: null``,
    which the Origin check refuses.)"""
    also = " or this server's API key" if takes_api_key else ""
    error = f'<p class="error" role="alert">{html.escape(problem)}</p>' if problem else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>minisgl-chat: open the chat with its key</title>
<style>
{LOGIN_CSS}</style></head>
<body><main>
<h1>This chat is private to the person who started it</h1>
<p>Open the link that <code>minisgl-chat</code> printed in its terminal when it started
(<code>http://…/?token=…</code>), or enter its page key{also}.
The key is in the file <code>page-key</code> of the app's data folder
(<code>~/.local/share/minisgl-chat</code> on Linux, or <code>$MINISGL_DATA_DIR</code>).</p>
{error}
<form method="post" action="{LOGIN_PATH}">
<input type="hidden" name="next" value="{html.escape(next_path, quote=True)}">
<input type="password" name="key" aria-label="Key" placeholder="Key" autocomplete="current-password" autofocus required>
<button type="submit">Open</button>
</form>
</main></body></html>
"""


__all__ = ["PageGuard", "load_page_key", "page_link", "write_open_file"]
