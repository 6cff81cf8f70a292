"""A long message in the chat page, in Debian's Chromium, against the real app (issue 45, item 1:
"a long message looks like a hang"). While the engine reads the prompt, the line under the reply
says how far it has read ("reading your message: 4,096 / 8,343 tokens · ~40 s left"), the status
line counts the request as running, and Stop ends it mid-prefill.

The app reads prompts in the default CPU chunks: a first one of 128 tokens, then 512-token ones
(engine.FIRST_PREFILL_CHUNK_CPU), so the progress moves within two seconds of Send even on a busy
two-core machine, where a 512-token chunk of the demo model takes ~2.5 s."""

from __future__ import annotations

import re

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    browser,
    engine_idle,
    open_new_chat,
    status_text,
    wait_page_loaded,
)
from server_utils import ServerProcess, wait_until

pytestmark = BROWSER_MARKS

FIRST_CHUNK, CHUNK = 128, 512
# 20,000+ characters, ~5,000 tokens of the demo model: some eighty chunks
LONG_MESSAGE = " ".join(
    f"Note {i}: the heron waits by the reeds while the river runs slowly to the sea."
    for i in range(260)
)
READING = re.compile(r"reading your message: ([\d,]+) / ([\d,]+) tokens")

# Each new "reading your message" count the chat shows, with when it showed (performance.now()).
WATCH_READING_JS = """(pattern) => {
  window.readingSeen = [];
  const reading = new RegExp(pattern);
  const look = () => {
    for (const line of document.querySelectorAll('#chatbot .thought-group')) {
      const m = reading.exec(line.innerText);
      if (!m) continue;
      const done = Number(m[1].replace(/,/g, '')), last = window.readingSeen.at(-1);
      if (!last || last.done !== done) {
        window.readingSeen.push({done, total: Number(m[2].replace(/,/g, '')), at: performance.now(),
                                 line: line.innerText.trim()});
      }
    }
  };
  new MutationObserver(look).observe(document.querySelector('#chatbot'),
                                     {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A chat app of the demo model on its own data folder (the long chat stays out of the
    shared app's)."""
    srv = ServerProcess(
        "--no-browser",
        "--max-kv-tokens",
        "16384",
        command="chat",
        log_path=tmp_path_factory.mktemp("progress-app") / "app.log",
        env={"MINISGL_DATA_DIR": str(tmp_path_factory.mktemp("progress-app-data"))},
    )
    yield srv
    srv.stop()


@pytest.fixture
def page(browser, app):
    """A tab of its own (1280x800) on the app, a new chat open."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(app.page_url)
    wait_page_loaded(page)
    open_new_chat(page)
    yield page
    context.close()


def test_a_long_message_shows_its_prompt_progress_at_once_counts_as_running_and_stops(
    page, app
) -> None:
    assert len(LONG_MESSAGE) >= 20_000
    page.fill("#msg-input textarea", LONG_MESSAGE)
    page.evaluate(WATCH_READING_JS, READING.pattern)
    sent_at = page.evaluate("() => performance.now()")
    page.press("#msg-input textarea", "Enter")

    def seen() -> list[dict]:
        return page.evaluate("window.readingSeen")

    # it moves: a count read after another, each higher, all of one prompt's length
    assert wait_until(lambda: len(seen()) >= 3, 60), (
        f"no moving progress under the reply: {page.inner_text('#chatbot')[-300:]!r}"
    )
    counts = seen()
    first_s = (counts[0]["at"] - sent_at) / 1000
    moved_s = (counts[1]["at"] - sent_at) / 1000
    print(
        f"Send → first progress {first_s:.2f} s ({counts[0]['line']!r}), moved at {moved_s:.2f} s"
    )
    assert first_s <= 2.0, f"the first progress showed {first_s:.2f} s after Send"
    assert moved_s <= 2.0, f"the progress first moved {moved_s:.2f} s after Send"
    assert [c["done"] for c in counts] == sorted({c["done"] for c in counts})
    # (the first count is what the prefix cache held: the chat template's start, maybe)
    read = [c["done"] - counts[0]["done"] for c in counts[:3]]
    assert read == [0, FIRST_CHUNK, FIRST_CHUNK + CHUNK], counts
    total = counts[0]["total"]
    assert total > 8 * CHUNK and all(c["total"] == total for c in counts)
    assert counts[-1]["done"] < total, "the whole prompt was read before the checks"
    assert any(" left" in c["line"] for c in counts[1:]), counts

    # the status line counts it as running while it is read (it said "0 running")
    assert wait_until(lambda: "1 running" in status_text(page), 10), status_text(page)
    assert status_text(page).startswith("Generating")
    assert seen()[-1]["done"] < total, "the prompt was read before the status line was"

    # Stop ends it mid-prefill: the engine holds nothing, the progress line is gone
    page.click("#stop-btn")
    assert wait_until(lambda: engine_idle(app), 15), app.metrics()
    assert wait_until(lambda: "reading your message" not in page.inner_text("#chatbot"), 10)
    assert wait_until(lambda: "0 running" in status_text(page), 10), status_text(page)
    assert app.metrics()["minisgl_prompt_tokens_pending"] == 0


# Each new line under the reply while the prompt is read, with when it showed (performance.now()).
WATCH_LINES_JS = """() => {
  window.linesSeen = [];
  const look = () => {
    for (const line of document.querySelectorAll('#chatbot .thought-group')) {
      const text = line.innerText.trim();
      if (text.includes('reading your message') && window.linesSeen.at(-1)?.text !== text)
        window.linesSeen.push({text, at: performance.now() / 1000});
    }
  };
  new MutationObserver(look).observe(document.querySelector('#chatbot'),
                                     {subtree: true, childList: true, characterData: true});
}"""
LEFT = re.compile(r"reading your message: ([\d,]+) / [\d,]+ tokens · ~(\d+) (s|min) left")


def test_the_time_left_counts_down_between_chunks_and_follows_their_pace(page, app) -> None:
    """The time left under a long message ("· ~40 s left") changed only when a chunk was read,
    at the average pace since the first chunk: it stood still for a chunk's time and then jumped.
    It counts down between chunks, at the chunks' smoothed pace: no step of it rises, or falls
    further than the time it took, by more than a few seconds."""
    page.fill("#msg-input textarea", LONG_MESSAGE)
    page.evaluate(WATCH_LINES_JS)
    page.press("#msg-input textarea", "Enter")

    def seen() -> list[tuple[int, float, float]]:  # (tokens read, seconds left, when)
        out = []
        for line in page.evaluate("window.linesSeen"):
            m = LEFT.search(line["text"])
            if m:
                left = int(m[2]) * (60 if m[3] == "min" else 1)
                out.append((int(m[1].replace(",", "")), left, line["at"]))
        return out

    assert wait_until(lambda: len([s for s in seen() if s[1] < 90]) >= 8, 90), seen()
    page.click("#stop-btn")
    steps = [s for s in seen() if s[1] < 90]
    assert any(a[0] == b[0] for a, b in zip(steps, steps[1:])), (
        f"the time left changed only with a chunk read: {steps}"
    )
    print(f"(tokens read, seconds left, at): {steps}")
    for (_, left, at), (_, later, then) in zip(steps, steps[1:]):
        slack = max(3, 0.15 * left)  # a chunk slower than the ones before moves it up a little
        assert left - (then - at) - slack <= later <= left + slack, (left, later, steps)
    assert wait_until(lambda: engine_idle(app), 15), app.metrics()
