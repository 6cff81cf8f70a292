"""OpenAI-compatible routes (/v1/chat/completions, /v1/completions, /v1/models) plus /health and
/metrics, over a front-end client that turns a :class:`GenerateRequest` into a stream of
:class:`UserReply`.

Both completion routes go through one path, :func:`_serve`: a request's reply stream is closed
whenever the HTTP side stops wanting it (finished, refused, client gone), and closing it is what
aborts the request in the engine and gives its KV pages back.

Beside it: the request bodies (openai_protocol.py) and response bodies (openai_responses.py),
errors in OpenAI's shape (error_responses.py), the API key check (api_key.py), and what
/v1/completions spells differently from chat (completions.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from ..messages import LogprobEntry, UserReply
from ..reasoning import ReasoningSplitter, split_reasoning
from ..sampling_params import SamplingParams
from ..tool_calls import ToolCall, ToolCallParser, parse_tool_calls
from ..tool_prompt import DEFAULT_TOOL_FORMAT
from ..workers.frontend import GenerateRequest
from .api_key import RequireApiKey
from .completions import CompletionFormat, prompt_texts
from .error_responses import APIError, ClientGone, install_error_handlers, send_too_large
from .metrics import StatsSource, metrics_router
from .openai_protocol import ChatCompletionRequest, CompletionRequest
from .openai_responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    UsageInfo,
    chat_logprobs,
    new_id,
    now,
)
from .request_limits import MAX_REQUEST_BYTES, BodyLimit
from .response_format import ChoiceResult, ResponseFormat
from .security import AccessPolicy, install_guard

DISCONNECT_POLL_S = 0.1
T = TypeVar("T")


class FrontendClient(StatsSource, Protocol):
    """What the routes need of the front end (frontend.py's ``FrontendClient``; tests pass fakes)."""

    model_name: str  # the model's name (server.served_model_name): what /v1/models lists unless create_app gets others
    ready: bool
    thinks: (
        str | None
    )  # the model writes <think> blocks ("model" opens them, "template": the prompt did), None: no
    tool_format: str | None  # how the model writes tool calls (tool_calls.py), None if it has none
    max_context_len: int | None  # the model's context in tokens, None until it is resolved
    tokenizer_path: str | None  # the model's tokenizer (to echo a prompt given as token ids)

    def generate(
        self, req: GenerateRequest, stop: asyncio.Event | None = None
    ) -> AsyncGenerator[UserReply, None]:
        """Replies for one request, the last with ``finished=True``; closing the generator
        early, or setting ``stop``, aborts the request."""
        ...

    def route(self, req: GenerateRequest) -> int:
        """The replica (--dp) that requests sharing ``req``'s prompt should all go to."""
        ...


# --- the one path both completion routes take -----------------------------------------------


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects: FastAPI never cancels a handler
    itself, so without this a closed tab would keep its request generating to the end."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})


def _refusal(reply: UserReply, produced_text: bool) -> APIError:
    """An engine error before any text is the request's fault (too long, bad template): 400.
    One after text means something broke mid-way: 500."""
    message = reply.error or "the engine could not serve this request"
    if produced_text:
        return APIError(500, message, type="server_error")
    return APIError(400, message)


_ENDED_EARLY = "the engine ended the request without finishing it"


async def _merge(
    upstreams: list[AsyncGenerator[UserReply, None]],
) -> AsyncGenerator[tuple[int, UserReply], None]:
    """The replies of a request's choices (prompts × n), each tagged with its choice's index, as
    they come. Closing this (the response is done, the client left, a choice failed) closes
    every choice's stream, which aborts those still running in the engine."""
    if len(upstreams) == 1:  # the common case, without tasks
        try:
            async for reply in upstreams[0]:
                yield 0, reply
        finally:
            await upstreams[0].aclose()
        return
    queue: asyncio.Queue[tuple[int, UserReply | Exception | None]] = asyncio.Queue()

    async def pump(index: int, upstream: AsyncGenerator[UserReply, None]) -> None:
        try:
            async for reply in upstream:
                queue.put_nowait((index, reply))
        except Exception as exc:  # a refused request (RequestError): the consumer raises it
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, upstream)) for i, upstream in enumerate(upstreams)]
    try:
        live = len(tasks)
        while live:
            index, reply = await queue.get()
            if reply is None:
                live -= 1
            elif isinstance(reply, Exception):
                raise reply
            else:
                yield index, reply
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for upstream in upstreams:
            await upstream.aclose()


async def _collect(
    merged: AsyncGenerator[tuple[int, UserReply], None], count: int
) -> list[ChoiceResult]:
    """Each choice's whole text, final reply and logprobs."""
    parts: list[list[str]] = [[] for _ in range(count)]
    logprobs: list[list[LogprobEntry] | None] = [None] * count
    prompt_logprobs: list[list[LogprobEntry] | None] = [None] * count
    finals: list[UserReply | None] = [None] * count
    async for index, reply in merged:
        parts[index].append(reply.incremental_output)
        if reply.logprobs is not None:
            logprobs[index] = (logprobs[index] or []) + reply.logprobs
        if reply.prompt_logprobs is not None:
            prompt_logprobs[index] = reply.prompt_logprobs
        if reply.finished:
            if reply.finish_reason == "error":
                raise _refusal(reply, any(parts[index]))
            finals[index] = reply
    if any(final is None for final in finals):
        raise APIError(500, _ENDED_EARLY, type="server_error")
    return [
        ChoiceResult("".join(p), final, lp, plp)
        for p, final, lp, plp in zip(parts, finals, logprobs, prompt_logprobs)
    ]


async def _until_first_text(
    merged: AsyncGenerator[tuple[int, UserReply], None], count: int
) -> list[tuple[int, UserReply]]:
    """Replies up to each choice's first with text (or its last): a refusal must become an HTTP
    error before the 200 of a stream is sent."""
    replies: list[tuple[int, UserReply]] = []
    started: set[int] = set()
    async for index, reply in merged:
        replies.append((index, reply))
        if reply.finished and reply.finish_reason == "error":
            raise _refusal(reply, produced_text=bool(reply.incremental_output) or index in started)
        if reply.incremental_output or reply.finished:
            started.add(index)
            if len(started) == count:
                return replies
    raise APIError(500, _ENDED_EARLY, type="server_error")


async def _prefill_once(client: FrontendClient, req: GenerateRequest) -> None:
    """Run a prompt once (one greedy token) before its n choices: when it ends, its KV is in the
    radix cache, and the n choices, sent after it, find it there instead of each prefilling the
    prompt (SGLang does the same for parallel sampling). A prompt the engine refuses is refused
    here, before any choice starts."""
    # one greedy token and nothing else the choices ask for (a grammar, penalties, min_tokens...)
    upstream = client.generate(replace(req, params=SamplingParams(max_tokens=1)))
    try:
        await _collect(_merge([upstream]), 1)
    finally:
        await upstream.aclose()


class _ChatFormat(ResponseFormat):
    """Chat replies: text as ``content``; a thinking model's <think> block as ``reasoning_content``
    (``split_reasoning``); with tools, the calls the model writes in ``tool_format`` as
    ``tool_calls`` (and finish reason "tool_calls")."""

    def __init__(
        self, model: str, split_reasoning: str | None = None, tool_format: str | None = None
    ) -> None:
        """``split_reasoning``: None, or how the model thinks (``reasoning.thinking_mode``)."""
        super().__init__(model)
        self.id = new_id("chatcmpl")
        self.split_reasoning = split_reasoning
        self.tool_format = tool_format
        self.splitters: dict[int, ReasoningSplitter] = {}
        self.parsers: dict[int, ToolCallParser] = {}
        self.calls_sent: dict[int, int] = {}  # choice -> tool calls streamed so far

    def _chunk(
        self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def opening(self, index: int) -> list[BaseModel]:
        return [
            self._chunk([ChatChunkChoice(index=index, delta={"role": "assistant", "content": ""})])
        ]

    def _deltas(
        self, index: int, reasoning: str, answer: str, calls: list[ToolCall]
    ) -> list[BaseModel]:
        deltas: list[dict] = [{"reasoning_content": reasoning}] if reasoning else []
        deltas += [{"content": answer}] if answer else []
        for call in calls:
            sent = self.calls_sent.get(index, 0)
            deltas.append({"tool_calls": [call.to_openai(sent)]})
            self.calls_sent[index] = sent + 1
        chunks = [ChatChunkChoice(index=index, delta=delta) for delta in deltas]
        if chunks:
            chunks[0].logprobs = self._logprobs(index)
        return [self._chunk([chunk]) for chunk in chunks]

    def _logprobs(self, index: int) -> dict | None:
        entries = self.take_logprobs(index)
        return chat_logprobs(entries) if entries else None

    def _answer(self, index: int, answer: str, final: bool) -> tuple[str, list[ToolCall]]:
        if self.tool_format is None:
            return answer, []
        parser = self.parsers.setdefault(index, ToolCallParser(self.tool_format))
        content, calls = parser.push(answer)
        if final:
            more, more_calls = parser.flush()
            content, calls = content + more, calls + more_calls
        return content, calls

    def text_chunks(self, index: int, text: str) -> list[BaseModel]:
        if self.split_reasoning:
            reasoning, answer = self.splitters.setdefault(
                index, ReasoningSplitter(self.split_reasoning == "template")
            ).push(text)
        else:
            reasoning, answer = "", text
        return self._deltas(index, reasoning, *self._answer(index, answer, final=False))

    def finish_chunks(self, index: int, finish_reason: str | None) -> list[BaseModel]:
        reasoning, answer = self.splitters[index].flush() if index in self.splitters else ("", "")
        held = self._deltas(index, reasoning, *self._answer(index, answer, final=True))
        if self.calls_sent.get(index) and finish_reason == "stop":
            finish_reason = "tool_calls"
        last = ChatChunkChoice(
            index=index, delta={}, logprobs=self._logprobs(index), finish_reason=finish_reason
        )
        return held + [self._chunk([last])]

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        return self._chunk([], usage)

    def _choice(
        self, index: int, text: str, finish_reason: str | None, logprobs: list[LogprobEntry] | None
    ) -> ChatChoice:
        reasoning, answer = (
            split_reasoning(text, self.split_reasoning == "template")
            if self.split_reasoning
            else (None, text)
        )
        calls: list[ToolCall] = []
        if self.tool_format is not None:
            answer, calls = parse_tool_calls(answer, self.tool_format)
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        message = AssistantMessage(
            content=answer if answer or not calls else None,
            reasoning_content=reasoning,
            tool_calls=[call.to_openai() for call in calls] or None,
        )
        return ChatChoice(
            index=index,
            message=message,
            finish_reason=finish_reason,
            logprobs=chat_logprobs(logprobs) if logprobs is not None else None,
        )

    def response(self, choices: list[ChoiceResult], usage: UsageInfo) -> BaseModel:
        out = [
            self._choice(i, c.text, c.final.finish_reason, c.logprobs)
            for i, c in enumerate(choices)
        ]
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=out, usage=usage
        )


def _usage(finals: list[UserReply], n: int) -> UsageInfo:
    """A prompt counts once however many choices it has (choices i*n .. i*n+n-1 share prompt i);
    every choice's tokens count."""
    return UsageInfo.of(
        sum(r.prompt_tokens for r in finals[::n]), sum(r.completion_tokens for r in finals)
    )


def _sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


async def _event_stream(
    merged: AsyncGenerator[tuple[int, UserReply], None],
    first: list[tuple[int, UserReply]],
    fmt: ResponseFormat,
    count: int,
    n: int,
    include_usage: bool,
) -> AsyncGenerator[str, None]:
    """SSE events: each choice's opening chunk, text chunks, one finish chunk per choice, usage if
    asked, [DONE]."""
    try:
        for index in range(count):
            for chunk in fmt.opening(index):
                yield _sse(chunk)
        pending = deque(first)
        finals: dict[int, UserReply] = {}
        while len(finals) < count:
            item = pending.popleft() if pending else await anext(merged, None)
            if item is None:
                yield _sse(
                    ErrorResponse(error=ErrorInfo(message=_ENDED_EARLY, type="server_error"))
                )
                break
            index, reply = item
            fmt.add_logprobs(index, reply)
            if reply.incremental_output:
                for chunk in fmt.text_chunks(index, reply.incremental_output):
                    yield _sse(chunk)
            if not reply.finished:
                continue
            if reply.finish_reason == "error":  # the 200 is already sent: report it in-band
                info = ErrorInfo(message=reply.error or "generation failed", type="server_error")
                yield _sse(ErrorResponse(error=info))
                break
            finals[index] = reply
            for chunk in fmt.finish_chunks(index, reply.finish_reason):
                yield _sse(chunk)
        else:
            if include_usage:
                yield _sse(fmt.usage_chunk(_usage([finals[i] for i in range(count)], n)))
        yield _sse("[DONE]")
    finally:
        await merged.aclose()


class _EventStreamResponse(StreamingResponse):
    """Starlette stops a stream whose client left but does not close its body generator;
    closing it here runs the generator's ``finally`` at once, which aborts the request. A client
    leaving is normal, so it is not raised on (ASGI 2.4 servers would log it as an error)."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _serve(
    request: Request,
    client: FrontendClient,
    body: ChatCompletionRequest | CompletionRequest,
    fmt: ResponseFormat,
) -> Response:
    """One HTTP request: its prompts × n choices as engine requests, answered as one response
    (or one stream), choice i*n + j being prompt i's j-th."""
    per_prompt = body.generate_requests()
    body.check_generated_tokens(client.max_context_len)
    if body.n > 1 and per_prompt[0][0].params.prompt_logprobs is None:
        # a prompt's choices, and the prefill before them, on one replica (--dp): one cache
        # (choices that score their prompt compute it whole: nothing to prefill for them)
        per_prompt = [
            [replace(req, replica=replica) for req in choices]
            for choices, replica in zip(
                per_prompt, [client.route(choices[0]) for choices in per_prompt]
            )
        ]
        await _unless_disconnected(
            request, asyncio.gather(*(_prefill_once(client, choices[0]) for choices in per_prompt))
        )
    requests = [req for choices in per_prompt for req in choices]
    merged = _merge([client.generate(req) for req in requests])
    handed_over = False
    try:
        if not body.stream:
            results = await _unless_disconnected(request, _collect(merged, len(requests)))
            usage = _usage([result.final for result in results], body.n)
            return JSONResponse(fmt.response(results, usage).model_dump(mode="json"))
        first = await _unless_disconnected(request, _until_first_text(merged, len(requests)))
        events = _event_stream(merged, first, fmt, len(requests), body.n, body.include_usage)
        handed_over = True
        return _EventStreamResponse(
            events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
    finally:
        if not handed_over:
            await merged.aclose()


# --- the app --------------------------------------------------------------------------------


def _model_served(requested: str | None, names: tuple[str, ...]) -> str:
    """The name a reply carries: the first of ``names``, when the request names one of them or
    none; any other model is a 404, as OpenAI answers it."""
    if requested is not None and requested not in names:
        raise APIError(
            404, f"The model `{requested}` does not exist.", param="model", code="model_not_found"
        )
    return names[0]


def _chat_format(
    body: ChatCompletionRequest,
    client: FrontendClient,
    model: str,
    trust_request_chat_template: bool,
) -> _ChatFormat:
    """How a chat request's reply is spelled: its think block split off or not, its tool calls
    parsed in the model's format. A request the server will not take as asked is a 400."""
    template_field = body.request_chat_template()
    if template_field is not None and not trust_request_chat_template:
        raise APIError(
            400,
            f"{template_field}: this server does not take chat templates from requests (a template is code "
            "its tokenizer runs); start it with --trust-request-chat-template to allow them",
            param=template_field,
            code="chat_template_not_allowed",
        )
    # a reply held to a grammar (JSON, a forced tool call) has no think block to split off,
    # even where the template opens one in the prompt
    constrained = (
        (body.response_format or {}).get("type", "text") != "text"
        or body.regex is not None
        or body.ebnf is not None
        or body.tool_choice == "required"
        or isinstance(body.tool_choice, dict)
    )
    split = client.thinks if body.separate_reasoning and not constrained else None
    tool_format = None
    if body.uses_tools:  # a template without tools gets the default tool prompt
        tool_format = client.tool_format or DEFAULT_TOOL_FORMAT
        body.use_tool_format(tool_format, default_prompt=client.tool_format is None)
    return _ChatFormat(model, split, tool_format)


def _v1_router(
    client: FrontendClient,
    served_model_names: tuple[str, ...],
    trust_request_chat_template: bool = False,
) -> APIRouter:
    router = APIRouter(prefix="/v1")
    created = now()
    startup_model = client.model_name

    def served() -> tuple[str, ...]:
        """The names of the model served now: --served-model-name's for the start-up model, the
        model's own after the chat page switched to another one."""
        if served_model_names and client.model_name == startup_model:
            return served_model_names
        return (client.model_name,)

    @router.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        model = _model_served(body.model, served())
        fmt = _chat_format(body, client, model, trust_request_chat_template)
        return await _serve(request, client, body, fmt)

    @router.post("/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        model = _model_served(body.model, served())
        echo = await prompt_texts(client.tokenizer_path, body.prompts) if body.echo else None
        return await _serve(
            request, client, body, CompletionFormat(model, echo, body.n, body.prompt_only)
        )

    @router.get("/models")
    async def models() -> ModelList:
        return ModelList(
            data=[ModelCard(id=served()[0], created=created, max_model_len=client.max_context_len)]
        )

    return router


def create_app(
    client: FrontendClient,
    api_key: str | None = None,
    access: AccessPolicy | None = None,
    served_model_names: Sequence[str] = (),
    trust_request_chat_template: bool = False,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> FastAPI:
    """The HTTP app over ``client``. With ``api_key``, /v1/* needs ``Authorization: Bearer <key>``;
    /health and /metrics stay open (they carry no prompt text). ``access`` says which Host names
    and foreign Origins are answered (security.py); by default those of a loopback server.
    ``served_model_names`` (--served-model-name): the names a request's ``model`` may give, the
    first listed by /v1/models and echoed in every reply; by default ``client.model_name`` only
    (read at each request: it follows a model switch). ``trust_request_chat_template``
    (--trust-request-chat-template): a chat request may bring its own chat template; otherwise
    one that does is a 400. A /v1 body over ``max_request_bytes`` (--max-request-bytes) is a 413,
    said before it is read (request_limits.BodyLimit)."""
    app = FastAPI(title="minisgl-chat", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.add_middleware(
        BodyLimit, limit=max_request_bytes, on_too_large=send_too_large
    )  # inside the key check
    if api_key:
        app.add_middleware(RequireApiKey, api_key=api_key)
    install_guard(
        app, access or AccessPolicy.for_bind("127.0.0.1")
    )  # outermost: before the key check
    app.include_router(_v1_router(client, tuple(served_model_names), trust_request_chat_template))
    app.include_router(metrics_router(client))

    @app.get("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        if client.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "starting"}, status_code=503)

    return app
