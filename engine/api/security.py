"""What keeps web pages in the user's own browser away from the server (docs/security.md).

A page at ``evil.example`` can make the browser send requests to ``127.0.0.1:1919``; the
browser's same-origin rules stop it from reading the answers, unless the page rebinds its own
name to 127.0.0.1 (DNS rebinding), after which it *is* same-origin in the browser's eyes. What
tells such a request apart is its ``Host`` header, which still says ``evil.example``. So every
request passes :class:`RequestGuard` first, before any route:

- **Host check**: only names that mean this server (``localhost``, ``127.0.0.1``, ``[::1]``, the
  ``--host`` address and, for a wildcard bind, this machine's addresses and names, plus
  ``--allowed-hosts``); anything else is a 403.
- **Origin check**: a state-changing request (any method but GET/HEAD) or a WebSocket whose
  ``Origin`` is neither this server nor listed in ``--allowed-origins`` is a 403: a foreign page
  cannot post a message, delete a chat or run the model. Clients that send no ``Origin`` (curl,
  the ``openai`` package) are not browsers and pass.
- **Protective headers** on every response: no framing (clickjacking), no MIME sniffing, no
  ``Referer`` leaking chat URLs.
- **No UI internals as an API**: Gradio's routes that call page events by name are refused; the
  page itself calls its events through the queue, the OpenAI routes are the programmatic surface.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import UserError

logger = logging.getLogger("minisgl.security")

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD"})
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
FRAME_ANCESTORS = "frame-ancestors 'none'"
# Gradio routes that run a page event by its name (its "API"): not ours to offer. The page's
# own calls name events by index: queued ones through /gradio_api/queue/join, the others through
# /gradio_api/run/predict (no event is called "predict").
GRADIO_NAMED_CALLS = (
    "/gradio_api/call/",
    "/gradio_api/run/",
    "/gradio_api/api/",
    "/gradio_api/mcp",
    "/gradio_api/run-history/",
    "/gradio_api/runs",
)
GRADIO_PAGE_CALLS = frozenset({"/gradio_api/run/predict"})
MAX_LOGGED_REFUSALS = 100  # distinct refusals logged at warning level; later ones at debug


def host_name(host_header: str | None) -> str | None:
    """The name part of a ``Host`` header, lower-case, without port or IPv6 brackets
    (``[::1]:1919`` -> ``::1``); None if it does not parse."""
    if not host_header:
        return None
    try:
        name = urlsplit(f"//{host_header}").hostname
    except ValueError:
        return None
    return name.rstrip(".").lower() if name else None


def _machine_names() -> set[str]:
    """This machine's names and addresses: what a LAN client puts in ``Host`` when the server
    listens on every interface."""
    import psutil

    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0].lower())  # drop an IPv6 zone (fe80::1%eth0)
    return names


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def parse_origin(origin: str) -> str:
    """``scheme://host[:port]`` as browsers send it in ``Origin``, normalised; UserError if
    ``origin`` is not one (a path, no scheme, ...)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise UserError(
            f"--allowed-origins: {origin!r} is not an origin like http://localhost:3000 (scheme, host, optional port)"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


@dataclass(frozen=True)
class AccessPolicy:
    """Which ``Host`` names and which foreign ``Origin``s the server answers."""

    hosts: frozenset[str]
    origins: tuple[str, ...] = ()

    @classmethod
    def for_bind(
        cls,
        bind_host: str,
        allowed_hosts: tuple[str, ...] = (),
        allowed_origins: tuple[str, ...] = (),
    ) -> AccessPolicy:
        hosts = set(LOOPBACK_NAMES)
        bind = bind_host.strip("[]").lower()
        if _is_wildcard(bind):
            hosts |= _machine_names()
        else:
            hosts.add(bind)
        for name in allowed_hosts:
            parsed = host_name(name.strip())
            if parsed is None:
                raise UserError(f"--allowed-hosts: {name!r} is not a host name or address")
            hosts.add(parsed)
        return cls(frozenset(hosts), tuple(dict.fromkeys(parse_origin(o) for o in allowed_origins)))

    def allows_host(self, host_header: str | None) -> bool:
        return host_name(host_header) in self.hosts

    def allows_origin(self, origin: str, host_header: str | None) -> bool:
        """The server's own origin (the one the ``Host`` header names), or a listed one."""
        try:
            given = parse_origin(origin)
        except UserError:
            return False  # "null" (sandboxed frames, file:// pages) and other oddities
        if given in self.origins:
            return True
        return host_header is not None and urlsplit(given).netloc == host_header.lower()


class RequestGuard:
    """ASGI middleware, outermost: the Host and Origin checks, the refused Gradio routes and the
    protective headers, for every route of the app (page, Gradio API, /v1, /metrics, /health)."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy
        self.logged: set[tuple[str, str, str]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        reason = self.refusal(scope)
        if reason is not None:
            await self.refuse(scope, receive, send, *reason)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                add_security_headers(MutableHeaders(scope=message))
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, one-line reason) if the request is refused, else None."""
        headers = Headers(scope=scope)
        host = headers.get("host")
        if not self.policy.allows_host(host):
            return (
                403,
                "host_not_allowed",
                (
                    f"Host {host!r} is not this server's name; "
                    "to reach it under another name, start it with --allowed-hosts NAME"
                ),
            )
        origin = headers.get("origin")
        changes_state = scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS
        if origin is not None and changes_state and not self.policy.allows_origin(origin, host):
            return (
                403,
                "origin_not_allowed",
                (
                    f"requests from the web page at {origin!r} are not accepted; "
                    "to allow a browser-based client there, start the server with --allowed-origins ORIGIN"
                ),
            )
        path = scope.get("path", "")
        if path.startswith(GRADIO_NAMED_CALLS) and path not in GRADIO_PAGE_CALLS:
            return (
                404,
                "not_found",
                "the chat page's events are not an API; use the OpenAI-compatible routes under /v1",
            )
        return None

    async def refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, code: str, reason: str
    ) -> None:
        # what was refused and why; never a body, a query string or a header other than the one at fault
        key = (scope.get("method", ""), scope.get("path", ""), reason)
        level = (
            logging.WARNING
            if len(self.logged) < MAX_LOGGED_REFUSALS and key not in self.logged
            else logging.DEBUG
        )
        self.logged.add(key)
        logger.log(
            level,
            "refused %s %s (%d): %s",
            scope.get("method", "WEBSOCKET"),
            scope.get("path", ""),
            status,
            reason,
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
            return
        body = {
            "error": {
                "message": reason,
                "type": "forbidden" if status == 403 else "not_found",
                "param": None,
                "code": code,
            }
        }
        response = JSONResponse(body, status_code=status)
        add_security_headers(response.headers)
        await response(scope, receive, send)


def add_security_headers(headers: MutableHeaders) -> None:
    for name, value in SECURITY_HEADERS.items():
        headers[name] = value
    csp = headers.get("content-security-policy")
    if csp is None:
        headers["content-security-policy"] = FRAME_ANCESTORS
    elif "frame-ancestors" not in csp:
        headers["content-security-policy"] = f"{csp}; {FRAME_ANCESTORS}"


def install_guard(app, policy: AccessPolicy) -> None:
    """Put the guard outermost and CORS (for ``policy.origins`` only) right inside it.

    A CORS middleware of our own also tells Gradio not to add its own CORS headers, which would
    share the page's API with pages on other localhost ports."""
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(policy.origins),
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["authorization", "content-type"],
        allow_credentials=False,
    )
    app.add_middleware(RequestGuard, policy=policy)
