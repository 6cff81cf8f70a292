"""What the page shows, as plain functions of the stored conversation and the live replies (no
Gradio here, so the logic is tested without a browser).

The chat is rendered as Gradio message dicts. A reply's figures (time to first token, tok/s,
tokens) are not part of its text: they travel as a separate small message marked with
``metadata`` (Gradio shows it as a collapsed line under the reply), so Copy gives the reply's
Markdown alone. ``ViewMessage.source`` maps each shown message back to the stored one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime

from .live import LiveReply, PromptReading
from .store import (
    ChatSettings,
    Conversation,
    ConversationSummary,
    Message,
    MessageStats,
    ToolCallRecord,
)

VERSIONS_HINT = "Click a message, then ‹ › under the chat to see its other versions."
WAITING_LINE = "waiting: answered when the reply above ends"
WAITING_HINT = (
    "Sent while the chat was replying: it is answered next. Stop ends the reply above and leaves this "
    "message unanswered (↻ then answers it)."
)
UNANSWERED_LINE = "not answered: ↻ answers it"
UNANSWERED_HINT = (
    "The chat stopped before this message's turn came (Stop was pressed while it waited, its tab was "
    "closed, or the app stopped). ↻ below asks for the reply."
)
OVER_CONTEXT_LINE = (
    "not answered: the chat is longer than the model reads · ↻ answers it without the oldest turns"
)
OVER_CONTEXT_HINT = (
    "This chat's setting *When the chat is longer than the model's context* is *Stop and say so*. "
    "↻ below answers this message once with the oldest turns left out (they stay in the chat); "
    "the other setting does that every time."
)
BEYOND_CONTEXT_LINE = "earlier messages are beyond what the model reads"
BEYOND_CONTEXT_HINT = (
    "The chat is longer than the model's context: for the last reply the model read the system prompt "
    "and the messages below this line only. The messages above stay in the chat."
)
# a question left unanswered with a later question sent after it: the reply answers the later one
LEFT_LINE = "not answered"
LEFT_HINT = (
    "The chat stopped before this message's turn came, and a later message was sent: the reply answers that one, "
    "and the model does not see this one. To ask it, send it again."
)


def left_unanswered(messages: list[Message], i: int) -> bool:
    """Whether question ``i`` of a chat's path was left without a reply: marked so when a later
    question was sent after it (ChatPage.send) and still followed by another question (a reply
    right after it, as ↻ gives it once the later ones are deleted, answers it)."""
    m = messages[i]
    return (
        m.role == "user"
        and m.stats is not None
        and m.stats.unanswered
        and i + 1 < len(messages)
        and messages[i + 1].role == "user"
    )


@dataclass(frozen=True)
class ViewMessage:
    """One message on the page and the stored message it shows (a stats or version line shows
    the message above it); ``shown`` without ``metadata`` is the message itself."""

    shown: dict
    source: Message | None
    earlier: int = (
        0  # the "Show earlier messages" line: how many messages of the path are not shown
    )

    @property
    def is_line(self) -> bool:
        return "metadata" in self.shown


def focus_of(conv: Conversation | None, chosen: int | None) -> Message | None:
    """The message the versions bar acts on: the one the user clicked, if still shown; else the
    deepest message of the last turn (the last question and its reply) that has other versions.
    A version of an earlier turn shows the bar only when clicked: after a new message the bar
    would otherwise name a message far above the one just sent."""
    if conv is None:
        return None
    by_id = {m.id: m for m in conv.messages}
    if chosen in by_id:
        return by_id[chosen]
    questions = [i for i, m in enumerate(conv.messages) if m.role == "user"]
    last_turn = conv.messages[questions[-1] :] if questions else conv.messages
    return next((m for m in reversed(last_turn) if m.sibling_count > 1), None)


def versions_label(conv: Conversation, focus: Message) -> str:
    """The versions bar's label: which message it acts on and, if it has several, which version."""
    who = "Your message" if focus.role == "user" else "Reply"
    turn = [m.id for m in conv.messages if m.role == focus.role].index(
        focus.id
    ) + 1  # "Reply 1": the first reply
    if focus.sibling_count <= 1:  # only Delete message applies
        return f"{who} {turn}"
    return f"{who} {turn}: version {focus.sibling_index + 1} of {focus.sibling_count}"


def version_steps(focus: Message | None) -> tuple[bool | None, bool | None]:
    """Whether ‹ and › can go to an earlier or later version of ``focus``; None: not shown (no
    message in the bar, or one with no other version)."""
    if focus is None or focus.sibling_count <= 1:
        return None, None
    return focus.sibling_index > 0, focus.sibling_index < focus.sibling_count - 1


def can_continue(conv: Conversation | None) -> bool:
    """A reply that was stopped or cut at max tokens can be continued."""
    last = conv.messages[-1] if conv is not None and conv.messages else None
    return (
        last is not None
        and last.role == "assistant"
        and bool(last.content)
        and last.stats is not None
        and not is_failed(last)
        and (last.stats.stopped or last.stats.finish_reason == "length")
    )


def is_failed(message: Message) -> bool:
    """A reply the engine refused (its text is the reason, not the model's words)."""
    return (
        message.role == "assistant"
        and message.stats is not None
        and message.stats.finish_reason == "error"
    )


# A chat shows the last WINDOW messages of its path at first; a line above them, "Show N earlier
# messages", shows WINDOW more at each click (a 100,000-message chat crashed the browser's tab).
WINDOW = 200


def windowed(conv: Conversation, window: int) -> tuple[Conversation, int]:
    """``conv`` with only the last ``window`` messages of its path, and how many are left out before them."""
    hidden = max(0, len(conv.messages) - window)
    return (replace(conv, messages=conv.messages[hidden:]) if hidden else conv), hidden


def earlier_line(hidden: int) -> ViewMessage:
    """The line above a chat shown in part: a click on it shows up to WINDOW more messages."""
    more = min(hidden, WINDOW)
    rest = f" (of {hidden:,} not shown)" if hidden > more else ""
    text = f"⤒ <strong>Show {more:,} earlier {'message' if more == 1 else 'messages'}</strong>{rest}: click here"
    # its class lets the page's CSS take away the Copy and ✎ that Gradio gives every message (page_css.NO_DOTS)
    return ViewMessage(
        {"role": "assistant", "content": f'<span class="earlier-line">{text}</span>'},
        None,
        earlier=hidden,
    )


def line_under(m: Message, role: str, title: str, content: str) -> ViewMessage:
    """A collapsed line that belongs to message ``m`` (its stats, its version, why it waits):
    ``title`` shows, ``content`` opens under it. Status "done": collapsed, and no spinner (an
    animation costs a software-rendered browser as much CPU as the engine gets)."""
    return ViewMessage(
        {"role": role, "content": content, "metadata": {"title": title, "status": "done"}}, m
    )


def trailing_questions(messages: list[Message]) -> set[int]:
    """The questions at the chat's end, after its last reply: waiting, or left unanswered."""
    trailing = set()
    for j in range(len(messages) - 1, -1, -1):
        if messages[j].role != "user":
            break
        trailing.add(j)
    return trailing


def reply_parts(m: Message, content: str, streaming: bool) -> list[ViewMessage]:
    """A reply's text, with each thinking section as a collapsed line above the answer (as the
    stats line under it); nothing yet (or stopped before its first word): no part, only the
    line under it."""
    parts = []
    for text, thinking, still_open in split_thinking(content):
        if thinking:
            title = "Thinking…" if still_open and streaming else "Thought"
            parts.append(line_under(m, "assistant", title, shown_literally(text)))
        elif text:
            parts.append(ViewMessage({"role": "assistant", "content": shown_literally(text)}, m))
    return parts


TOOL_STATES = {
    "waiting": "asks to run: Allow once, Always allow or Deny, under the chat",
    "running": "running…",
    "done": "done",
    "error": "failed",
    "denied": "denied",
    "stopped": "stopped",
}


def reply_with_calls(
    m: Message, content: str, calls: tuple[ToolCallRecord, ...], streaming: bool
) -> list[ViewMessage]:
    """A reply's parts with its tool calls where the model made them: each a collapsed line
    (the tool and how it went) that opens on its arguments and result."""
    out: list[ViewMessage] = []
    start = 0
    for call in sorted(calls, key=lambda c: c.offset):
        out += reply_parts(m, content[start : call.offset], streaming)
        out.append(tool_call_line(m, call))
        start = max(start, call.offset)
    return out + reply_parts(m, content[start:], streaming)


def tool_call_line(m: Message, call: ToolCallRecord) -> ViewMessage:
    title = f"🔧 {markdown_literal(call.tool)} · {TOOL_STATES.get(call.state, call.state)}"
    body = f"Arguments:\n\n{code_block(call.arguments)}"
    if call.result:
        body += f"\n\nResult:\n\n{code_block(call.result)}"
    return line_under(m, "assistant", title, body)


def code_block(text: str) -> str:
    """``text`` as a fenced code block that no backticks in it can close."""
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", text)), default=0))
    return f"{fence}\n{text}\n{fence}"


def question_lines(
    messages: list[Message], i: int, version: str, waiting: bool, trailing: bool
) -> list[ViewMessage]:
    """The lines under question ``i``: which of its versions it is, and where its reply would be,
    why there is none: left for a later question, waiting its turn in a busy chat (``waiting``),
    or left unanswered at the chat's end (``trailing``: ↻ answers the chat's last ones)."""
    m = messages[i]
    lines = [line_under(m, "user", version, VERSIONS_HINT)] if version else []
    if left_unanswered(messages, i):
        lines.append(line_under(m, "assistant", LEFT_LINE, LEFT_HINT))
    elif waiting and trailing:
        lines.append(line_under(m, "assistant", WAITING_LINE, WAITING_HINT))
    elif trailing and m.stats is not None and m.stats.over_context:
        lines.append(line_under(m, "assistant", OVER_CONTEXT_LINE, OVER_CONTEXT_HINT))
    elif trailing:
        lines.append(line_under(m, "assistant", UNANSWERED_LINE, UNANSWERED_HINT))
    return lines


def last_unread(messages: list[Message]) -> int | None:
    """The id of the last message the chat's latest reply did not read (the turns before it
    were dropped to fit the model's context); None: it read them all."""
    reply = next((m for m in reversed(messages) if m.role == "assistant"), None)
    read_from = reply.stats.read_from if reply is not None and reply.stats is not None else None
    ids = [m.id for m in messages]
    if read_from is None or read_from not in ids or ids.index(read_from) == 0:
        return None
    return ids[ids.index(read_from) - 1]


def reading_line(reading: PromptReading, now: float | None = None) -> str:
    """How far the engine has read a long prompt: "reading your message: 4,096 / 8,343 tokens ·
    ~40 s left" (the time left at ``now``, once a chunk's time is known: PromptReading)."""
    line = f"reading your message: {reading.done:,} / {reading.total:,} tokens"
    left = reading.seconds_left(now)
    if left is None or reading.done >= reading.total:
        return line
    return (
        f"{line} · ~{round(left)} s left" if left < 90 else f"{line} · ~{round(left / 60)} min left"
    )


def reply_line(
    m: Message, version: str, streaming: bool, reading: PromptReading | None = None
) -> list[ViewMessage]:
    """The line under a reply: its version, its figures (or "replying…", or how far a long
    prompt has been read before the first word) and its model; none for a failed reply (its text
    says why) or one with nothing to say."""
    if is_failed(m):
        return []
    if streaming:
        line = reading_line(reading) if reading is not None else "replying…"
    else:
        line = shown_stats(m.stats).summary() if m.stats else ""
    line = " · ".join(
        x for x in (version, line, markdown_literal(m.model) if line and m.model else None) if x
    )
    return [line_under(m, "assistant", line, ending(m, streaming))] if line else []


def view_messages(
    conv: Conversation | None,
    live: LiveReply | None = None,
    busy: bool = False,
    window: int | None = None,
) -> list[ViewMessage]:
    """The conversation as the chat shows it; the live reply's text replaces its stored copy
    (which is written only every half second); ``window``: show only the last so many messages
    (``windowed``), under ``earlier_line``. ``busy``: the chat has a reply running or queued,
    so a question at its end waits for its turn (and says so); a question at the end of a chat
    that is not busy was left unanswered, and says that instead. These lines sit where the
    question's reply goes, on the model's side, all of them: "waiting" sat on the user's side and
    "not answered" on the model's. (Not the user's side: Gradio offers ↻ only under a last message
    of the model's, and ↻ is what answers a question left unanswered.)"""
    if conv is None:
        return []
    out: list[ViewMessage] = []
    if window is not None:  # the last ``window`` messages, under a line that shows earlier ones
        conv, hidden = windowed(conv, window)
        if hidden:
            out.append(earlier_line(hidden))
    unread = last_unread(conv.messages)
    trailing = trailing_questions(conv.messages)
    for i, m in enumerate(conv.messages):
        if m.role == "system":
            continue
        streaming = live is not None and live.message_id == m.id and not live.done
        content = live.text if streaming else m.content
        version = f"version {m.sibling_index + 1}/{m.sibling_count}" if m.sibling_count > 1 else ""
        if m.role == "assistant":
            calls = live.tool_calls if streaming else m.tool_calls
            out += reply_with_calls(m, content, calls, streaming)
        else:
            out.append(ViewMessage({"role": m.role, "content": shown_literally(content)}, m))
        if m.role == "user":
            out += question_lines(conv.messages, i, version, busy, i in trailing)
        else:  # a reply (or a tool's message): the line under it
            reading = live.reading if streaming and live.first_token is None else None
            out += reply_line(m, version, streaming, reading)
        if m.id == unread:
            out.append(line_under(m, "assistant", BEYOND_CONTEXT_LINE, BEYOND_CONTEXT_HINT))
    return out


# HTML in a message shows as typed. The page renders messages as Markdown, which passes HTML on
# to the browser: "<div>hello</div>" showed "hello", "a <b> c" a bold "c", "the <style> tag" ended
# at "the". Gradio escapes per chatbot, not per message, and its Copy and edit box take a
# message's text as sent, so the text is not HTML-escaped either: a word joiner (invisible, and
# no tag or entity starts with it) follows each "<" that would open a tag and each "&" that would
# start an entity, outside code (where Markdown shows them as they are) and math.
# ``typed_text`` takes the marks out again (ui.edit_text; PAGE_JS for Copy and copies).
MARK = "\u2060"
# Inline math between single dollars is found here, by Pandoc's rule (tex_math_dollars), not by
# KaTeX, which takes any two dollars for math: "It costs $5 and $10." showed "5 and " typeset. A
# "$" opens math only with a non-space after it, the next "$" closes it only with a non-space
# before it and no digit after it, a "$" after a backslash is a dollar, and no blank line lies
# inside. Each math found is put between MATH_MARKs (invisible), the page's delimiters for it
# (page/following.py); a "$" left alone is a dollar (and "\$" one too, by Markdown's escape).
MATH_MARK = "\u2063"
_INLINE_MATH = r"(?<![\\$])\$(?![\s$])(?:[^$\\\n]|\\.|\n(?![ \t]*\n))+(?<!\s)\$(?![\d$])"
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_KEPT = re.compile(
    r"(`+)(?:.+?)(?<!`)\1(?!`)|\$\$.+?\$\$|(?P<math>" + _INLINE_MATH + r")"
    r"|<[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*>",
    re.S,
)  # code spans, math, autolinks
_OPENS_HTML = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)")


def shown_literally(text: str) -> str:
    """``text`` (Markdown) with its HTML marked to show as typed (MARK), its inline math between
    MATH_MARKs, and its numbered lines with the numbers written (``numbered_as_written``)."""
    return numbered_as_written(_marked(text))


def _marked(text: str) -> str:
    if "<" not in text and "&" not in text and "![" not in text and "$" not in text:
        return text
    out, prose, fence = [], [], None
    for line in text.splitlines(keepends=True):
        opened = _FENCE.match(line)
        if fence is None and opened:
            out.append(_mark_prose("".join(prose)))
            prose, fence = [], opened.group(1)
            out.append(line)
        elif fence is not None:
            out.append(line)
            if (
                opened
                and opened.group(1)[0] == fence[0]
                and len(opened.group(1)) >= len(fence)
                and not line.strip(" \t\r\n" + fence[0])
            ):
                fence = None
        else:
            prose.append(line)
    return "".join(out) + _mark_prose("".join(prose))


def _mark_prose(text: str) -> str:
    parts, at = [], 0
    for kept in _KEPT.finditer(text):
        math = kept.group("math")
        parts += [
            _mark_span(text[at : kept.start()]),
            MATH_MARK + math + MATH_MARK if math else kept.group(0),
        ]
        at = kept.end()
    parts.append(_mark_span(text[at:]))
    return "".join(parts)


def _mark_span(text: str) -> str:
    return _OPENS_HTML.sub(lambda m: m.group(0) + MARK, images_as_links(text))


# A numbered line shows its number as written. Markdown numbers a list's items from its first
# (a reply counting "1. 2. 249." showed "1. 2. 3."), and numbers nothing else: an item whose number
# is not the one before it plus one starts a list of its own, which starts at its number
# (<ol start>). LIST_BREAK, an empty HTML comment between blank lines, at the item's indent (in
# the item above, if nested), ends the list before it; it is no part of the text as typed
# (``typed_text``; page.js for Copy). A message's own "<!" is marked (MARK), so this one is ours.
LIST_BREAK = "<!---->"
_LIST_ITEM = re.compile(r"( *)(?:(\d{1,9})([.)])|[-+*])(?=[ \t\n]|$)( *)")
_ANY_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_LIST_BREAK_LINES = re.compile(r"\n[ \t]*" + re.escape(LIST_BREAK) + r"\n\n")


@dataclass
class _OpenItem:
    content: int  # the column its text starts at: a line less indented after a blank line ends it
    delimiter: str | None  # "." or ")" of a numbered item; None for a bullet
    number: int


def numbered_as_written(text: str) -> str:
    """``text`` (Markdown) with a LIST_BREAK before each numbered item that Markdown would number
    otherwise than written (see above); code is left alone."""
    if not re.search(r"^ *\d{1,9}[.)][ \t]", text, re.M):
        return text
    out: list[str] = []
    items: list[_OpenItem] = []  # the list items open, the outermost first
    fence, blank = None, False
    for line in text.splitlines(keepends=True):
        opened = _ANY_FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            blank = True
        elif (item := _LIST_ITEM.match(line)) and (
            indent <= 3 or (items and items[-1].content <= indent <= items[-1].content + 3)
        ):
            above = None
            while items and items[-1].content > indent:  # a sibling above ends, and what it holds
                above = items.pop()
            number = int(item.group(2)) if item.group(2) else 0
            if above is not None and item.group(3) and above.delimiter == item.group(3):
                if number != above.number + 1:
                    out.append("\n" + " " * indent + LIST_BREAK + "\n\n")
            after = len(item.group(4))
            width = item.end(4) - item.end(1) - after
            items.append(
                _OpenItem(indent + width + (after if 1 <= after <= 4 else 1), item.group(3), number)
            )
            blank = False
        else:
            if blank or opened or line.lstrip().startswith("#"):
                while items and items[-1].content > indent:
                    items.pop()
            blank = False
            if opened:
                fence = opened.group(1)
        out.append(line)
    return "".join(out)


# An image in a message is not loaded: a model's reply (or a pasted text) could name a URL that
# carries what the chat says to another host ("![x](http://host/p.png?secret=PIN)" would be
# fetched as soon as the chat opens). A Markdown image shows as a link to it, "🖼 x · image
# from host — click to open", which a click opens; its alt text sits between two IMAGE_MARKs
# (invisible), so that ``typed_text`` turns the link back into the image as typed (Copy, ✎). Any
# other "![" (a reference image, one this pattern does not read) gets a MARK after its "!": no
# longer an image. HTML <img> is shown as typed, as all HTML in a message; the page's
# Content-Security-Policy (app/page/csp.py) is the second guard. Outside code, as the HTML marks.
IMAGE_MARK = "\u2062"
_IMAGE = re.compile(r"!\[((?:[^\[\]\\\n]|\\.){0,500})\]\(([^()\n]*)\)")
_IMAGE_LINK = re.compile(
    r"\[🖼 \u2062([^\u2062]*)\u2062[^\]\u2062]*\]\("
)  # what typed_text turns back


def images_as_links(text: str) -> str:
    """``text`` (Markdown prose) with each image as a link to it (see above)."""
    if "![" not in text:
        return text
    parts, at = [], 0
    for m in _IMAGE.finditer(text):
        before = text[at : m.start()].replace("![", "!" + MARK + "[")
        before += MARK if before.endswith("!") else ""  # "!" and the link would be an image again
        parts += [before, _image_link(m.group(1), m.group(2))]
        at = m.end()
    parts.append(text[at:].replace("![", "!" + MARK + "["))
    return "".join(parts)


def _image_link(alt: str, inside: str) -> str:
    from urllib.parse import urlsplit

    url = (inside.split() or [""])[0].strip("<>")
    host = urlsplit(url).hostname if "//" in url else None
    where = f"image from {markdown_literal(host)}" if host else "image"
    return f"[🖼 {IMAGE_MARK}{alt}{IMAGE_MARK}{' · ' if alt.strip() else ''}{where} — click to open]({inside})"


# A name, a path or a reason shown inside a sentence of Markdown (the models panel, the import's
# line): unlike a message (shown_literally keeps its Markdown), none of it is Markdown. "a*b*"
# showed "ab" in italics, "my_model_v2" lost its underscores to emphasis, "<b>x" opened a tag,
# "[x](y)" made a link, "https://…" an autolink. Each character that can start Markdown or HTML
# inside a line is escaped with a backslash (CommonMark shows any ASCII punctuation as itself after
# one); "/", "-", "." and the like are left as they are (they mean something only at a line's
# start, and these texts sit inside a sentence); a line break becomes a space.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>&~|$!#:])")


def markdown_literal(text) -> str:
    """``text`` (a string or an exception) escaped to show as typed inside a Markdown sentence."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def typed_text(shown: str) -> str:
    """A message's text as the user typed it, from the text the page showed (``shown_literally``)."""
    if IMAGE_MARK in shown:
        shown = _IMAGE_LINK.sub(lambda m: "![" + m.group(1) + "](", shown)
    if LIST_BREAK in shown:
        shown = _LIST_BREAK_LINES.sub("", shown)
    shown = shown.replace("<" + MARK, "<").replace("&" + MARK, "&").replace("!" + MARK, "!")
    return shown.replace(MATH_MARK, "")


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_thinking(text: str) -> list[tuple[str, bool, bool]]:
    """A reasoning model's reply as ``(text, is_thinking, still_open)`` parts, so the page shows
    its <think> block apart from the answer. Done here rather than by Gradio's reasoning_tags, so
    that the page's message indexes (of a click or an edit) stay those of ``view_messages``. A
    reply whose block was opened by the chat template (only the closing tag in the reply) counts
    as thinking up to that tag."""
    if THINK_OPEN not in text and THINK_CLOSE not in text:
        return [(text, False, False)]
    head, close, _ = text.partition(THINK_CLOSE)
    if close and THINK_OPEN not in head:
        text = THINK_OPEN + text
    parts: list[tuple[str, bool, bool]] = []
    rest = text
    while rest:
        answer, opened, rest = rest.partition(THINK_OPEN)
        parts.append((answer, False, False))
        if not opened:
            break
        thought, closed, rest = rest.partition(THINK_CLOSE)
        parts.append((thought, True, not closed))
    return [(t.strip(), thinking, still_open) for t, thinking, still_open in parts if t.strip()]


def shown_stats(stats: MessageStats) -> MessageStats:
    """A reply's stats with their text escaped for the line under it (Markdown, which passes HTML
    on): ``stopped_by`` is ours ("switch to <model>") or, in an imported chat, the file's, like its
    ``model`` ("<img src=x onerror=...>**bold**" there must show as typed, not as HTML)."""
    return (
        replace(stats, stopped_by=markdown_literal(stats.stopped_by)) if stats.stopped_by else stats
    )


def ending(m: Message, streaming: bool) -> str:
    """The stats line's details: how the reply ended."""
    if streaming:
        return "The reply is streaming; Stop (or Escape) ends it."
    reason = m.stats.finish_reason if m.stats else None
    if m.stats is not None and m.stats.edited:
        return (
            "You wrote this version (✎); the model's versions, with their figures, are under ‹ ›."
        )
    if m.stats is not None and m.stats.stopped:
        return (
            f"Stopped before the end ({markdown_literal(m.stats.stopped_by)})."
            if m.stats.stopped_by
            else "Stopped before the end."
        )
    return {
        "stop": "The model finished its answer.",
        "length": "Cut at this chat's max tokens (Settings).",
    }.get(reason or "", "Ended.")


def engine_messages(conv: Conversation, settings: ChatSettings) -> list[dict]:
    """What the model sees: the system prompt, then ``seen_messages``."""
    msgs = (
        [{"role": "system", "content": settings.system_prompt}]
        if settings.system_prompt.strip()
        else []
    )
    return msgs + [{"role": m.role, "content": m.content} for m in seen_messages(conv)]


def seen_messages(conv: Conversation) -> list[Message]:
    """The stored turns the model sees, leaving out a turn the engine refused (its question and
    the reason shown in its place), a turn whose reply is empty with the chat gone on after it
    (stopped before its first word, or the model said nothing: the question would otherwise run
    into the next one), empty replies, and the questions left unanswered before a later one
    (``left_unanswered``: the reply answers that one)."""
    seen = []
    turns = [m for m in conv.messages if m.role in ("user", "assistant")]
    for i, m in enumerate(turns):
        answer = turns[i + 1] if m.role == "user" and i + 1 < len(turns) else None
        if answer is not None and (
            is_failed(answer)
            or (answer.role == "assistant" and not answer.content and i + 2 < len(turns))
        ):
            continue
        if is_failed(m) or left_unanswered(turns, i):
            continue
        if m.role == "assistant" and not m.content:
            continue
        seen.append(m)
    return seen


def sidebar_choices(
    summaries: list[ConversationSummary], busy: set[int], now: datetime | None = None
) -> list[tuple[str, int]]:
    """(label, id) per conversation: its title, when it was last used, and a mark while it replies."""
    now = now or datetime.now()
    out = []
    for c in summaries:
        mark = "● " if c.id in busy else ""
        out.append((f"{mark}{c.title} · {when(c.updated_at, now)}", c.id))
    return out


def when(ts: float, now: datetime) -> str:
    """Sidebar dates: the time today, the weekday this week, else the date."""
    then = datetime.fromtimestamp(ts)
    if then.date() == now.date():
        return then.strftime("%H:%M")
    if 0 < (now.date() - then.date()).days < 7:
        return then.strftime("%a")
    return then.strftime("%Y-%m-%d")


def size_text(n_bytes: float) -> str:
    """A size as people read it: 0.52 GB, 41.3 MB."""
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.1f} MB"


def model_choices(entries) -> list[tuple[str, str]]:
    """(label, name) per model of the models panel (``ModelEntry``s): name, size, architecture
    and context; those serving now (one per backend) marked ●."""
    out = []
    for e in entries:
        parts = [f"{'● ' if e.serving else ''}{e.name}"]
        if e.size_bytes:
            parts.append(size_text(e.size_bytes))
        if e.architecture:
            parts.append(e.architecture)
        if e.context_len:
            parts.append(f"{e.context_len:,} tokens")
        out.append((" · ".join(parts), e.name))
    return out


def status_line(client) -> str:
    """The model, the device and the engine's load, in one line: "Generating" while the engine
    has requests (any tab's or the API's), "Ready" once it is idle."""
    if not client.ready:
        if client.startup_errors:
            worker, error = next(iter(client.startup_errors.items()))
            return f"**Error:** {worker} failed to start: {error}"
        done = len(client.worker_info)
        total = len(client.expected_workers)
        if client.switching:
            return (
                f"**Loading** {client.model_name}: {client.phase}… ({done}/{total} engine processes ready); "
                "send your message once it has loaded"
            )
        return f"**Starting** {client.model_name}: {client.phase}… ({done}/{total} engine processes ready)"
    sched = client.scheduler_info
    # with --dp, every replica's device (each replica's rank 0 reports one)
    devices = [
        info["device"]
        for name, info in sorted(client.worker_info.items())
        if name.endswith("-scheduler") and "device" in info
    ]
    s = client.stats
    if s is None:
        load = ""
    else:
        # short, and last: the whole line wrapped at 1280 px ("KV cache: 1,234 in use, 567 cached, 8,000 total pages")
        kv = f"KV {s.kv_pages_used:,}/{s.kv_pages_total:,} pages ({s.kv_pages_cached:,} cached)"
        load = f" · {s.running} running, {s.waiting} waiting{wide_only(' · ' + kv)}"
    # "Ready" while a reply streams read as if nothing were happening: the engine's state comes first
    state = GENERATING if s is not None and (s.running or s.waiting) else READY
    dtype = wide_only(f" ({sched.get('dtype', '?')})")
    return f"{state} · {client.model_name} on {', '.join(devices) or '?'}{dtype}{load}"


READY, GENERATING = "**Ready**", "**Generating**"  # how status_line starts


def while_replying(line: str) -> str:
    """The status line of a page whose chat has a reply running or queued: Generating at once.
    The engine's figures come a step after the request reaches it, and the line said Ready for
    up to a second after Send, beside a reply that said "replying…"."""
    return GENERATING + line[len(READY) :] if line.startswith(READY) else line


def wide_only(text: str) -> str:
    """A part of the status line left out on a narrow screen (page_css.NARROW), where the whole
    line took four lines above the chat. ``text`` is the page's own, with nothing to escape."""
    return f'<span class="wide-only">{text}</span>'
