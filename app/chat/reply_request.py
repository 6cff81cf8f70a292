"""What a chat's next reply asks the engine, read from the chat as stored when the reply starts
(after any reply before it in the chat): the messages it answers, and the request made from the
chat's own settings. The page's turns (app/page/turns.py) store the reply and start it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from minisgl_engine import GenerateRequest, SamplingParams, UserError

from .context_fit import ContextOverflow, Fit, fit_messages, reply_room
from .reply_protocol import ReplySource
from .store import ChatSettings, Conversation, Message
from .tool_loop import CALLS, ToolBox, ToolLoop, spelled_out, tool_key
from .view import engine_messages, seen_messages


def answered_path(
    conv: Conversation, after: int | None = None, continue_id: int | None = None
) -> list[Message] | None:
    """The messages of the chat's shown path that the reply answers: all of them, or those up to
    ``after`` (a question: a new version of its reply) or ``continue_id`` (a reply that goes on).
    None when there is nothing to answer: that message is gone or no longer shown, or the path no
    longer ends in a question (a reply to go on with) — stopped, deleted or answered meanwhile."""
    path = conv.messages
    ids = [m.id for m in path]
    cut = after if after is not None else continue_id
    if cut is not None:
        if cut not in ids:
            return None
        path = path[: ids.index(cut) + 1]
    if not path or path[-1].role != ("assistant" if continue_id is not None else "user"):
        return None
    return path


def sampling_params(s: ChatSettings) -> SamplingParams:
    """The chat's settings as the engine samples by them (top-k 0: off)."""
    return SamplingParams(
        max_tokens=int(s.max_tokens),
        temperature=float(s.temperature),
        top_p=float(s.top_p),
        top_k=int(s.top_k) or -1,
        seed=s.seed,
        stop=list(s.stop),
        repetition_penalty=float(s.repetition_penalty),
    )


def reply_request(
    conv: Conversation, path: list[Message], source: ReplySource, continuing: bool
) -> GenerateRequest:
    """The request for a reply to ``path`` (``answered_path``), with the system prompt in front;
    ``continuing``: the last message is a reply that the model extends."""
    s = conv.settings
    kwargs = {"enable_thinking": bool(s.thinking)} if source.supports_thinking else {}
    if continuing:
        kwargs["continue_final_message"] = True
    return GenerateRequest(
        params=sampling_params(s),
        messages=engine_messages(replace(conv, messages=path), s),
        chat_template_kwargs=kwargs or None,
    )


def with_calls(conv: Conversation, settings: ChatSettings) -> list[dict]:
    """``engine_messages``, each reply that called tools carrying its calls (tool_loop.CALLS):
    still one message per stored message, so the chat is fitted to the context by whole turns
    (a call never apart from its result); ToolLoop spells them out."""
    out = engine_messages(replace(conv, messages=[]), settings)  # the system prompt
    for m in seen_messages(conv):
        message = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message[CALLS] = list(m.tool_calls)
        out.append(message)
    return out


def tool_messages(conv: Conversation, settings: ChatSettings) -> list[dict]:
    """What the model sees in a request that offers tools: ``engine_messages``, with each reply
    that called tools spelled out as its call turns (tool_loop.call_turns)."""
    return spelled_out(with_calls(conv, settings))


def tool_loop_for(
    conv: Conversation, path: list[Message], request: GenerateRequest, box: ToolBox, source
) -> tuple[GenerateRequest, ToolLoop | None]:
    """The reply's tool loop (``chat_tool_loop``), and then ``request`` reading the chat with
    its earlier tool calls."""
    loop = chat_tool_loop(conv.settings, box, source)
    if loop is None:
        return request, None
    return replace(request, messages=with_calls(replace(conv, messages=path), conv.settings)), loop


def chat_tool_loop(settings: ChatSettings, box: ToolBox, source) -> ToolLoop | None:
    """A tool loop for a reply of a chat of ``settings``, when the chat offers tools that run
    now and its source can call them (its ``tool_wire``: this machine's engine, or a remote
    that takes OpenAI ``tools``); None otherwise."""
    tools = box.offered(settings.tools)
    wire = getattr(source, "tool_wire", None)
    if not tools or wire is None:
        return None
    forced = [t for t in tools if settings.tool_choice in ("required", tool_key(t))]
    return ToolLoop(box, tools, forced, set(settings.always_allow), wire)


class NoCount(Exception):
    """The source cannot count this prompt (a remote, a model without tokenizer or template)."""


# the messages of a request -> the prompt the model reads for them (messages, template kwargs)
PromptOf = Callable[[list[dict]], tuple[list[dict], dict | None]]


def fit_prompt(
    messages: list[dict],
    source: ReplySource,
    settings: ChatSettings,
    kwargs: dict | None,
    policy: str,
    wait: bool = True,
    prompt_of: PromptOf | None = None,
) -> Fit:
    """``messages`` fitted into the context of ``source`` under ``policy`` (context_fit), counted
    by its tokenizer; NoCount when it has none (a remote) or its chat template refuses them (the
    engine then says why), or (``wait`` False: the meter) while its tokenizer loads;
    context_fit.ContextOverflow when they cannot be sent. ``prompt_of``: what the model reads
    for some of the messages, where that is more than they are (a chat with tools: their
    calls spelled out, the tools offered); by default the messages and ``kwargs``."""
    count = getattr(source, "count_prompt_tokens", None)
    context = getattr(source, "context_len", None)
    if count is None or not context:
        raise NoCount()

    def tokens(msgs: list[dict]) -> int:
        prompt, template_kwargs = prompt_of(msgs) if prompt_of is not None else (msgs, kwargs)
        try:
            n = (
                count(prompt, template_kwargs)
                if wait
                else count(prompt, template_kwargs, wait=False)
            )
        except UserError:
            n = None
        if n is None:
            raise NoCount()
        return n

    return fit_messages(messages, tokens, context, reply_room(settings.max_tokens, context), policy)


def first_round_prompt(loop: ToolLoop, request: GenerateRequest) -> PromptOf:
    """What the model reads for some of ``request``'s messages in the first round of ``loop``:
    the calls spelled out, the tools offered (ToolLoop.first_round)."""

    def prompt_of(messages: list[dict]) -> tuple[list[dict], dict | None]:
        asked = loop.first_round(replace(request, messages=messages))
        return asked.messages, asked.chat_template_kwargs

    return prompt_of


def fitted_request(
    conv: Conversation,
    path: list[Message],
    request: GenerateRequest,
    source: ReplySource,
    policy: str,
    loop: ToolLoop | None = None,
) -> tuple[GenerateRequest, int | None]:
    """``request`` (``reply_request``'s for ``path``, or ``tool_loop_for``'s with its ``loop``)
    with its messages fitted into the model's context, and the id of the first stored message
    the model reads when older ones were left out (None: it reads them all, or the source cannot
    count). A chat with tools is counted as its first round asks (``ToolLoop.first_round``),
    and a reply's calls go with it. Raises ContextOverflow."""

    try:
        fit = fit_prompt(
            request.messages,
            source,
            conv.settings,
            request.chat_template_kwargs,
            policy,
            prompt_of=first_round_prompt(loop, request) if loop is not None else None,
        )
    except NoCount:
        return request, None
    if not fit.dropped:
        return request, None
    seen = seen_messages(replace(conv, messages=path))
    return replace(request, messages=fit.messages), seen[fit.dropped].id


def meter_text(
    conv: Conversation | None,
    settings: ChatSettings,
    typed: str,
    source: ReplySource,
    loop: ToolLoop | None = None,
) -> str:
    """The line under the message box: the tokens of the prompt that sending ``typed`` now would
    make (the chat so far, fitted to the context by its policy, and the message), of the
    model's context: "2,345 / 8,192 tokens", short enough for two lines beside the box. Empty
    where the source cannot count (a remote). ``loop``: the chat's tools (``tool_loop_for``),
    counted as the reply's first round offers them, with the earlier calls spelled out."""
    conv = conv if conv is not None else Conversation(0, "", 0.0, 0.0, settings)  # a new chat
    # the chat as sending would store it, so that what the model reads is what it will read then
    # (a last question stopped before its first word is left out once another follows it)
    question = Message(-1, conv.id, len(conv.messages), "user", typed, 0.0)
    sent = replace(conv, messages=[*conv.messages, question])
    messages = with_calls(sent, settings) if loop is not None else engine_messages(sent, settings)
    kwargs = {"enable_thinking": bool(settings.thinking)} if source.supports_thinking else None
    context = getattr(source, "context_len", None)
    prompt_of = None
    if loop is not None:
        request = GenerateRequest(sampling_params(settings), chat_template_kwargs=kwargs)
        prompt_of = first_round_prompt(loop, request)
    try:
        fit = fit_prompt(
            messages, source, settings, kwargs, settings.context_policy, False, prompt_of
        )
    except NoCount:
        return ""
    except ContextOverflow as exc:
        if not exc.droppable:
            return f"⚠ message too long for {context:,} tokens"
        return f"⚠ {exc.prompt_tokens:,} / {context:,} tokens: too long"
    text = f"{fit.prompt_tokens:,} / {context:,} tokens"
    if fit.dropped:
        text += f" · oldest {fit.dropped:,} left out"
    return text
