"""The API key check (--api-key) in front of /v1/*."""

from __future__ import annotations

import hmac

from fastapi.security.utils import get_authorization_scheme_param
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .error_responses import error_json
from .openai_responses import ErrorInfo


class RequireApiKey:
    """ASGI middleware: /v1/* (and /openapi.json, which describes it) needs ``Authorization:
    Bearer <key>`` before anything else is looked at, so a client without the key learns
    nothing, not even whether its JSON parses.
    compare_digest, so the time taken reveals nothing about the key either."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope) and not self._authorized(scope):
            info = ErrorInfo(
                message="invalid or missing API key (send 'Authorization: Bearer <key>')",
                code="invalid_api_key",
            )
            response = error_json(401, info, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _guarded(scope: Scope) -> bool:
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):  # mounted under a prefix
            path = path[len(root) :]
        return path in ("/v1", "/openapi.json") or path.startswith("/v1/")

    def _authorized(self, scope: Scope) -> bool:
        scheme, key = get_authorization_scheme_param(Headers(scope=scope).get("authorization"))
        given = key.encode() if scheme.lower() == "bearer" else b""
        return hmac.compare_digest(given, self.expected)
