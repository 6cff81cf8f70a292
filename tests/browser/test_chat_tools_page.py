"""Tools in the chat page, in Debian's Chromium against the real app (demo model) and a real MCP
server over stdio (tests/mcp_test_server.py): the Tools panel adds the server and lists its
tools; a chat that must call ``add`` (tool choice, as the small model would not call it on its
own) shows the call and waits; Allow once runs it and the reply goes on; Deny is fed back and
shown; Stop while ``hang`` runs cancels it; removing the server ends its process."""

from __future__ import annotations

import json

import psutil
import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    add_test_tool_server,
    ask_and_wait_for_approval,
    browser,
    chat_lines,
    open_new_chat,
    pick_tool,
    put_setting,
    remove_tool_server,
    wait_page_loaded,
)
from server_utils import wait_until

from minisgl_app.chat.store import DB_NAME, ConversationStore
from minisgl_app.chat.tool_loop import DENIED, STOPPED

pytestmark = BROWSER_MARKS

REPLY_WAIT_S = 180  # a loaded 2-core machine is slow


@pytest.fixture
def page(browser, chat_app):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.goto(chat_app.page_url)
    wait_page_loaded(tab, "Ready", 180)
    yield tab
    context.close()


def last_reply(chat_app):
    with ConversationStore(chat_app.data_dir / DB_NAME) as store:
        newest = store.list()[0]
        return store.get(newest.id).messages[-1]


def test_a_forced_tool_call_is_approved_denied_and_stopped(page, chat_app, tmp_path):
    open_new_chat(page)
    page.click("#settings >> text=Settings")
    # greedy, and room for a call (the grammar lets the model write a long number)
    put_setting(page, "#temperature input[type=number]", "0")
    put_setting(page, "#max-tokens input", "64")
    add_test_tool_server(page, tmp_path / "pid")
    assert "with your rights" in page.inner_text("#tools-note")
    pid = int((tmp_path / "pid").read_text())
    pick_tool(page, "test/add")

    # Allow once: the tool runs, its result is stored with the reply, and the model goes on
    ask_and_wait_for_approval(page, "What is 2 + 40?", "test/add")
    page.click("#allow-once-btn")
    assert wait_until(lambda: "test/add · done" in chat_lines(page), REPLY_WAIT_S), chat_lines(page)
    assert wait_until(lambda: "tokens" in chat_lines(page), REPLY_WAIT_S), chat_lines(page)
    assert page.locator("#tool-approval").is_hidden()
    (call,) = last_reply(chat_app).tool_calls
    args = json.loads(call.arguments)
    assert (call.state, call.result) == ("done", str(args["a"] + args["b"]))

    # Deny: nothing runs; the model reads that the user denied it
    ask_and_wait_for_approval(page, "And 3 + 4?", "test/add")
    page.click("#deny-tool-btn")
    assert wait_until(lambda: "test/add · denied" in chat_lines(page), REPLY_WAIT_S), chat_lines(
        page
    )
    assert wait_until(lambda: last_reply(chat_app).stats.finish_reason is not None, REPLY_WAIT_S)
    (call,) = last_reply(chat_app).tool_calls
    assert (call.state, call.result) == ("denied", DENIED)

    # Stop while a tool runs: the call is cancelled and the reply ends at once
    pick_tool(page, "test/hang")
    ask_and_wait_for_approval(page, "Wait for me.", "test/hang")
    page.click("#allow-once-btn")
    assert wait_until(lambda: "test/hang · running" in chat_lines(page), 30), chat_lines(page)
    page.click("#stop-btn")
    assert wait_until(lambda: "test/hang · stopped" in chat_lines(page), 30), chat_lines(page)
    (call,) = last_reply(chat_app).tool_calls
    assert (call.state, call.result) == ("stopped", STOPPED)

    # the calls survive a reload
    page.reload()
    wait_page_loaded(page, "Ready", 60)
    assert "test/hang · stopped" in chat_lines(page)

    # Remove: the server's process ends
    remove_tool_server(page)
    assert wait_until(lambda: not alive(pid), 30), "the MCP server's process is still running"


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
