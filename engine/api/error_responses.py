"""Errors in OpenAI's shape: :class:`APIError` for a route to raise, and the handlers that turn
every other exception (validation, a refused request, a body too large, anything unexpected)
into the same JSON body."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from ..errors import RequestError
from .openai_responses import ErrorInfo, ErrorResponse
from .request_limits import RequestTooLarge


class APIError(Exception):
    """An error to send in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)
        self.headers = headers


class ClientGone(Exception):
    """The HTTP client left before its response was ready; nobody will read what we send."""


def error_json(status: int, info: ErrorInfo, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        ErrorResponse(error=info).model_dump(mode="json"), status_code=status, headers=headers
    )


def _is_union_tag(part: str | int) -> bool:
    """pydantic names the union member in an error's location ("list[int]", "str"); drop it."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line for the first problem, and the field it concerns (OpenAI's ``param``)."""
    # A value failing a union gets one error per member; our own checks and the deepest
    # location say the most (content parts: "type 'image_url' is not supported", not "not a str").
    error = max(exc.errors(), key=lambda e: (e["type"] == "value_error", len(e["loc"])))
    path = ".".join(str(part) for part in error["loc"][1:] if not _is_union_tag(part)) or None
    if error["type"] == "json_invalid":
        return f"invalid JSON body: {error.get('ctx', {}).get('error', error['msg'])}", None
    if error["type"] == "value_error":  # our own validators: their text alone reads best
        message = str(error.get("ctx", {}).get("error", error["msg"]))
    else:
        message = error["msg"]
    return f"{path or 'request body'}: {message}", path


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves in OpenAI's shape; FastAPI's 422 becomes OpenAI's 400."""

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> Response:
        return error_json(exc.status, exc.info, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return error_json(400, ErrorInfo(message=message, param=param))

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError) -> Response:
        return error_json(400, ErrorInfo(message=str(exc), param=getattr(exc, "param", None)))

    @app.exception_handler(RequestTooLarge)
    async def on_too_large(request: Request, exc: RequestTooLarge) -> Response:
        return too_large_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_json(
            exc.status_code,
            ErrorInfo(message=str(exc.detail), code=str(exc.status_code)),
            exc.headers,
        )

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; never read

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this, so the server logs the traceback; the client gets none.
        info = ErrorInfo(message="internal server error", type="server_error", code="500")
        return error_json(500, info)


def too_large_response(exc: RequestTooLarge) -> Response:
    return error_json(413, ErrorInfo(message=str(exc.detail), code="request_too_large"))


async def send_too_large(scope: Scope, receive: Receive, send: Send, exc: RequestTooLarge) -> None:
    await too_large_response(exc)(scope, receive, send)
