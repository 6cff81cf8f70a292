"""Tools in the chat page, in Debian's Chromium against the real app (demo model) and a real MCP
server over stdio (tests/mcp_test_server.py): the Tools panel adds the server and lists its
tools; a chat that must call ``add`` (tool choice, as the small model would not call it on its
own) shows the call and waits; Allow once runs it and the reply goes on; Deny is fed back and
shown; Stop while ``hang`` runs cancels it; removing the server ends its process."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import psutil
import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    LINE,
    browser,
    open_new_chat,
    put_setting,
    send,
    wait_page_loaded,
)
from server_utils import wait_until

from minisgl_app.chat.store import DB_NAME, ConversationStore
from minisgl_app.chat.tool_loop import DENIED, STOPPED

pytestmark = BROWSER_MARKS

SERVER = Path(__file__).parents[1] / "mcp_test_server.py"
REPLY_WAIT_S = 180  # a loaded 2-core machine is slow


@pytest.fixture
def page(browser, chat_app):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.goto(chat_app.page_url)
    wait_page_loaded(tab, "Ready", 180)
    yield tab
    context.close()


def lines(page) -> str:
    return page.inner_text("#chatbot") if page.locator(LINE).count() else ""


def last_reply(chat_app):
    with ConversationStore(chat_app.data_dir / DB_NAME) as store:
        newest = store.list()[0]
        return store.get(newest.id).messages[-1]


def pick_tool(page, tool: str) -> None:
    """The chat may call ``tool``, and must call it first in each reply."""
    page.click(f"#chat-tools label:has-text('{tool}')")
    choice = page.locator(f"#tool-choice label:has-text('{tool}')")
    choice.wait_for(state="visible", timeout=10_000)
    choice.click()
    assert wait_until(lambda: choice.locator("input").is_checked(), 10)


def ask_and_wait_for_approval(page, text: str, tool: str) -> None:
    send(page, text)
    page.wait_for_selector("#tool-approval", state="visible", timeout=REPLY_WAIT_S * 1000)
    assert tool in page.inner_text("#tool-approval")
    assert f"{tool} · asks to run" in lines(page)


def test_a_forced_tool_call_is_approved_denied_and_stopped(page, chat_app, tmp_path):
    open_new_chat(page)
    page.click("#settings >> text=Settings")
    # greedy, and room for a call (the grammar lets the model write a long number)
    put_setting(page, "#temperature input[type=number]", "0")
    put_setting(page, "#max-tokens input", "64")
    page.click('#tools >> text="Tools"')
    assert "with your rights" in page.inner_text("#tools-note")
    page.click("#add-tool-server >> text=Add an MCP server")
    page.fill("#tool-server-name textarea", "test")
    page.fill("#tool-command textarea", sys.executable)
    page.fill("#tool-args textarea", shlex.join([str(SERVER), str(tmp_path / "pid")]))
    page.click("#add-tool-server-btn")
    assert wait_until(lambda: "hang" in page.inner_text("#tool-servers"), 60)
    pid = int((tmp_path / "pid").read_text())
    pick_tool(page, "test/add")

    # Allow once: the tool runs, its result is stored with the reply, and the model goes on
    ask_and_wait_for_approval(page, "What is 2 + 40?", "test/add")
    page.click("#allow-once-btn")
    assert wait_until(lambda: "test/add · done" in lines(page), REPLY_WAIT_S), lines(page)
    assert wait_until(lambda: "tokens" in lines(page), REPLY_WAIT_S), lines(page)
    assert page.locator("#tool-approval").is_hidden()
    (call,) = last_reply(chat_app).tool_calls
    args = json.loads(call.arguments)
    assert (call.state, call.result) == ("done", str(args["a"] + args["b"]))

    # Deny: nothing runs; the model reads that the user denied it
    ask_and_wait_for_approval(page, "And 3 + 4?", "test/add")
    page.click("#deny-tool-btn")
    assert wait_until(lambda: "test/add · denied" in lines(page), REPLY_WAIT_S), lines(page)
    assert wait_until(lambda: last_reply(chat_app).stats.finish_reason is not None, REPLY_WAIT_S)
    (call,) = last_reply(chat_app).tool_calls
    assert (call.state, call.result) == ("denied", DENIED)

    # Stop while a tool runs: the call is cancelled and the reply ends at once
    pick_tool(page, "test/hang")
    ask_and_wait_for_approval(page, "Wait for me.", "test/hang")
    page.click("#allow-once-btn")
    assert wait_until(lambda: "test/hang · running" in lines(page), 30), lines(page)
    page.click("#stop-btn")
    assert wait_until(lambda: "test/hang · stopped" in lines(page), 30), lines(page)
    (call,) = last_reply(chat_app).tool_calls
    assert (call.state, call.result) == ("stopped", STOPPED)

    # the calls survive a reload
    page.reload()
    wait_page_loaded(page, "Ready", 60)
    assert "test/hang · stopped" in lines(page)

    # Remove: the server's process ends
    page.click('#tools >> text="Tools"')
    page.click("#add-tool-server >> text=Add an MCP server")
    page.fill("#tool-server-name textarea", "test")
    page.click("#remove-tool-server-btn")
    assert wait_until(lambda: not alive(pid), 30), "the MCP server's process is still running"


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
