"""The Tools panel: add an MCP server (a stdio command, or a streamable-HTTP URL), see its tools,
and pick the ones the chat shown may call (and the one it must call first, if any); and under
the chat, the buttons that answer a tool call waiting for approval. The loop that runs the calls
is app/chat/tool_loop.py; this module only reads and writes its state."""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr

from ..chat.mcp_tools import McpError
from ..chat.store import ChatSettings, NotFoundError
from ..chat.tool_loop import ALLOW_ALWAYS, ALLOW_ONCE, DENY, ToolBox, tool_key
from ..chat.view import markdown_literal
from . import toasts
from .page_view import Picked
from .tabs import Tab, TabState
from .wiring import QUICK, Wiring

TOOLS_NOTE = (
    "Tools come from MCP servers that you add here. A **stdio** server is a program that runs "
    "on this machine **with your rights** (it can read and change your files): add only ones you "
    "trust. A server starts when you add it, and with the page in later runs of the app. Each call waits for your "
    "approval under the chat unless you chose *Always allow* for that tool in that chat."
)
AUTO, REQUIRED = "auto", "required"


class ToolsPanel(TabState):
    """MCP servers, the tools each chat may call, and the answers to a call waiting for approval."""

    toolbox: ToolBox

    # ---- what the render shows (rendering.py)

    def tools_view(self, settings: ChatSettings) -> tuple[Picked, Picked]:
        """The chat's tools (those running, and those it picked) and the tool it must call."""
        running = [tool_key(t) for tools in self.toolbox.tools.values() for t in tools]
        choices = tuple(dict.fromkeys(running + list(settings.tools)))
        forced = (AUTO, REQUIRED, *settings.tools)
        choice = settings.tool_choice if settings.tool_choice in forced else AUTO
        return Picked(choices, tuple(settings.tools)), Picked(forced, choice)

    def approval_of(self, tab: Tab) -> str:
        """The line above the approval buttons: the first call of the shown chat's reply that
        waits for the user ("" when none does)."""
        reply = self.replies.live.get(tab.conv_id) if tab.conv_id is not None else None
        if reply is None or reply.tool_loop is None or not reply.tool_loop.waiting():
            return ""
        call = reply.tool_loop.waiting()[0]
        arguments = call.arguments.replace("`", "ˋ")  # a code span no backtick in it can end
        return f"The model asks to run **{markdown_literal(call.tool)}** with `{arguments}`"

    # ---- the panel's events

    async def open_tools(self) -> str:
        """A page loaded, or the panel opened: the servers added in an earlier run start now
        (once per app run), so a chat with tools has them before its first message."""
        for record in self.store.tool_servers():
            if record.name not in self.toolbox.servers:
                try:
                    await self.toolbox.start(record)
                except McpError:
                    pass  # said in the list below
        self.replies.notify()  # the render shows their tools
        return self.servers_text()

    def servers_text(self) -> str:
        lines = []
        for record in self.store.tool_servers():
            where = record.url or " ".join([record.command or "", *record.args])
            if record.name in self.toolbox.tools:
                names = ", ".join(t.name for t in self.toolbox.tools[record.name]) or "no tools"
                state = f"{names}"
            else:
                state = f"⚠️ {self.toolbox.errors.get(record.name, 'not running')}"
            lines.append(
                f"- **{markdown_literal(record.name)}** ({markdown_literal(where)}): "
                f"{markdown_literal(state)}"
            )
        return "\n".join(lines) or "No MCP servers yet."

    async def add_server(self, name: str, command: str, args: str, env: str, url: str):
        """Add: stored, then started (a stdio command) or reached (a URL) and its tools listed."""
        try:
            record = self.store.add_tool_server(
                name or "",
                command=(command or "").strip() or None,
                args=tuple(shlex.split(args or "")),
                env=env_lines(env or ""),
                url=(url or "").strip() or None,
            )
        except ValueError as exc:
            toasts.warn(f"Server not added: {exc}")
            return self.servers_text()
        try:
            await self.toolbox.start(record)
        except McpError as exc:
            toasts.warn(str(exc))
        self.replies.notify()
        return self.servers_text()

    async def remove_server(self, name: str):
        """Remove: the server stops (its process ends) and is forgotten."""
        record = next(
            (r for r in self.store.tool_servers() if r.name == (name or "").strip()), None
        )
        if record is None:
            toasts.warn("Type the name of a server in the list to remove it.")
            return self.servers_text()
        await self.toolbox.stop(record.name)
        self.store.delete_tool_server(record.id)
        self.replies.notify()
        return self.servers_text()

    def pick_tools(self, picked: list[str] | None, forced: str | None, request: gr.Request):
        """The chat shown may call ``picked``; ``forced``: auto, required, or the tool it must
        call first in each reply."""
        tab = self.tab(request)
        tools = tuple(picked or ())
        choice = forced if forced in (AUTO, REQUIRED, *tools) else AUTO
        self.change_tool_settings(tab, lambda s: replace(s, tools=tools, tool_choice=choice))

    def change_tool_settings(self, tab: Tab, change) -> None:
        """Apply ``change`` (settings -> settings) to the tab's chat, or its new chat."""
        conv = self.shown(tab)
        if conv is None:
            tab.new_chat_settings = change(self.settings_of(tab, None))
        else:
            try:
                self.store.update_settings(conv.id, change(conv.settings))
            except NotFoundError:
                pass
        self.replies.notify()

    def answer_call(self, decision: str, request: gr.Request) -> None:
        """Allow once, Always allow (the chat remembers the tool), or Deny the first call that
        the shown chat's reply waits on."""
        tab = self.tab(request)
        reply = self.replies.live.get(tab.conv_id) if tab.conv_id is not None else None
        waiting = reply.tool_loop.waiting() if reply and reply.tool_loop else []
        if not waiting:
            toasts.warn("No tool call is waiting for an answer.")
            return
        call = waiting[0]
        if decision == ALLOW_ALWAYS:
            self.change_tool_settings(
                tab,
                lambda s: replace(
                    s, always_allow=tuple(dict.fromkeys((*s.always_allow, call.tool)))
                ),
            )
        self.replies.decide(tab.conv_id, call.id, decision)

    def allow_once(self, request: gr.Request) -> None:
        self.answer_call(ALLOW_ONCE, request)

    def allow_always(self, request: gr.Request) -> None:
        self.answer_call(ALLOW_ALWAYS, request)

    def deny_call(self, request: gr.Request) -> None:
        self.answer_call(DENY, request)

    async def close_tools(self) -> None:
        await self.toolbox.close()

    def close_tools_soon(self) -> None:
        """The app stops (an exit hook, in its loop): the servers end, their processes with them."""
        asyncio.get_running_loop().create_task(self.close_tools())

    # ---- layout and events

    def tools_layout(self) -> SimpleNamespace:
        gr.Markdown(TOOLS_NOTE, elem_id="tools-note")
        servers = gr.Markdown("No MCP servers yet.", elem_id="tool-servers")
        picked = gr.CheckboxGroup(
            choices=[], label="Tools this chat may call", elem_id="chat-tools", interactive=True
        )
        forced = gr.Radio(
            choices=[AUTO, REQUIRED],
            value=AUTO,
            label="Tool choice",
            info="auto: the model decides; required or a tool: each reply's first answer calls one",
            elem_id="tool-choice",
            interactive=True,
        )
        with gr.Accordion("Add an MCP server", open=False, elem_id="add-tool-server"):
            name = gr.Textbox(label="Name", elem_id="tool-server-name")
            command = gr.Textbox(
                label="Command (stdio)", placeholder="uvx mcp-server-time", elem_id="tool-command"
            )
            args = gr.Textbox(label="Arguments", elem_id="tool-args")
            env = gr.Textbox(
                label="Environment",
                placeholder="KEY=value, one a line",
                lines=2,
                elem_id="tool-env",
            )
            url = gr.Textbox(
                label="Or a streamable-HTTP URL",
                placeholder="http://127.0.0.1:8000/mcp",
                elem_id="tool-url",
            )
            with gr.Row():
                add_btn = gr.Button("Add", elem_id="add-tool-server-btn", size="sm")
                remove_btn = gr.Button(
                    "Remove (by name)", elem_id="remove-tool-server-btn", size="sm"
                )
        return SimpleNamespace(
            servers=servers,
            picked=picked,
            forced=forced,
            name=name,
            command=command,
            args=args,
            env=env,
            url=url,
            add_btn=add_btn,
            remove_btn=remove_btn,
        )

    @staticmethod
    def approval_layout() -> SimpleNamespace:
        """The buttons that answer a tool call (shown while one waits)."""
        with gr.Row(elem_id="tool-approval", visible=False) as row:
            text = gr.Markdown("", elem_id="tool-approval-text")
            once = gr.Button("Allow once", elem_id="allow-once-btn", size="sm", scale=0)
            always = gr.Button(
                "Always allow this tool", elem_id="allow-always-btn", size="sm", scale=0
            )
            deny = gr.Button("Deny", elem_id="deny-tool-btn", size="sm", scale=0, variant="stop")
        return SimpleNamespace(
            approval=row,
            approval_text=text,
            allow_once_btn=once,
            allow_always_btn=always,
            deny_btn=deny,
        )

    def wire_tools(self, demo: gr.Blocks, w: Wiring) -> None:
        t, m = w.tools, w.main
        # each then renders the tab: the chat's tools list follows the servers running
        demo.load(self.open_tools, outputs=t.servers, **QUICK).then(**w.follow)
        t.box.expand(self.open_tools, outputs=t.servers, **QUICK).then(**w.follow)
        add = [t.name, t.command, t.args, t.env, t.url]
        t.add_btn.click(self.add_server, inputs=add, outputs=t.servers, **QUICK).then(**w.follow)
        t.remove_btn.click(self.remove_server, inputs=t.name, outputs=t.servers, **QUICK).then(
            **w.follow
        )
        for trigger in (t.picked.input, t.forced.input):
            trigger(self.pick_tools, inputs=[t.picked, t.forced], **QUICK).then(**w.follow)
        for button, answer in (
            (m.allow_once_btn, self.allow_once),
            (m.allow_always_btn, self.allow_always),
            (m.deny_btn, self.deny_call),
        ):
            button.click(answer, **QUICK).then(**w.follow)


def env_lines(text: str) -> dict[str, str]:
    """``KEY=value`` lines as a mapping (blank lines skipped); ValueError for another line."""
    env = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"environment lines are KEY=value, not {line!r}")
        env[key.strip()] = value
    return env
