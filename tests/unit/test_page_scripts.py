"""The chat page's JavaScript as app/page/scripts.py hands it to Gradio: the page script
(static/page.js) started with one JSON configuration, and each event's ``js`` one call of a
``window.minisgl*`` function that the page script defines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from minisgl_app.page import scripts
from minisgl_app.page.scripts import PAGE_CONFIG, PAGE_JS, PAGE_SCRIPT


def events_js() -> dict[str, str]:
    """Every event's ``js`` of scripts.py, by its name (confirm_js with a question of its own)."""
    found = {
        name: value
        for name, value in vars(scripts).items()
        if name.endswith("_JS") and name != "PAGE_JS"
    }
    found["confirm_js"] = scripts.confirm_js("Delete “this” message?")
    return found


def test_each_events_js_is_one_call_of_a_function_the_page_script_defines() -> None:
    defined = set(re.findall(r"^\s*window\.(minisgl\w+) = ", PAGE_SCRIPT, re.MULTILINE))
    assert len(events_js()) >= 17
    for name, js in events_js().items():
        assert "\n" not in js and re.fullmatch(
            r"\((\.\.\.inputs)?\) => window\.minisgl\w+\([^;{}]*\)", js
        ), (name, js)
        [called] = re.findall(r"window\.(minisgl\w+)", js)
        assert called in defined, (
            f"{name} calls window.{called}, which static/page.js does not define"
        )


def test_the_page_script_reads_the_configuration_it_is_started_with() -> None:
    """The configuration travels as one JSON object: what page.js reads of it is what is sent."""
    assert PAGE_JS.startswith(PAGE_SCRIPT)
    [sent] = re.findall(r"^minisglStartPage\((.*)\);$", PAGE_JS.removeprefix(PAGE_SCRIPT).strip())
    assert json.loads(sent) == PAGE_CONFIG
    assert set(re.findall(r"\bconfig\.(\w+)", PAGE_SCRIPT)) == set(PAGE_CONFIG)
    assert (
        PAGE_CONFIG["fieldIds"] == list(scripts.FIELD_IDS) and PAGE_CONFIG["answerWaitMs"] == 15000
    )


def test_gradio_runs_the_page_script_at_once_as_a_function_body() -> None:
    """Gradio 6 first reads a page's ``js`` as one expression (``return (js);``, a function is then
    called a step later, after the load events have started) and, where that is no JavaScript,
    as a function's body, run at once. The page script must be the second: the load events' js
    (ASKED_CHATS_JS, REMEMBER_SHOWN_CHAT_JS, MARK_LOADED_JS) call the functions it defines."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (make lint-static installs it in CI)")
    check = """
      const js = require('fs').readFileSync(0, 'utf8').trim().replace(/;+$/, '');
      let expression = true;
      try { new Function(`return (\\n${js}\\n);`); } catch { expression = false; }
      const window = Object.defineProperty({}, 'addEventListener', {value() {}});  // not a name the script defines
      const document = new Proxy({}, {get: () => () => null});
      Object.assign(globalThis, {window, document, navigator: {}, addEventListener() {}, matchMedia: () => ({matches: false}),
                                 MutationObserver: class { observe() {} }, ResizeObserver: class { observe() {} },
                                 setTimeout: () => 0, setInterval: () => 0, location: {search: '', href: 'http://x/'}});
      new Function(js)();
      console.log(JSON.stringify({expression, defined: Object.keys(window).sort()}));
    """
    proc = subprocess.run(
        [node, "-e", check], input=PAGE_JS, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert not result["expression"], (
        "Gradio would take the page script for one expression and run it late"
    )
    called = {re.search(r"window\.(minisgl\w+)", js)[1] for js in events_js().values()}
    assert called <= set(result["defined"]), called - set(result["defined"])
