"""Take README's screenshot (assets/screenshots/chat.png) of a running chat app.

    minisgl-chat --no-browser --port 19600 &      # an empty MINISGL_DATA_DIR is best
    python scripts/readme_screenshot.py http://127.0.0.1:19600

It plays a short chat in Chromium (Debian's /usr/bin/chromium, driven by Playwright): two chats,
a regenerated reply (so the versions bar shows ‹ 2 of 2 ›), then captures the page.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

OUT = Path(__file__).resolve().parent.parent / "assets" / "screenshots" / "chat.png"


def wait_for_stats(page, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = page.locator("#chatbot [data-testid='bot'] .thought-group").all_inner_texts()
        if sum("tok/s" in line for line in lines) >= count:
            return
        time.sleep(0.2)
    raise TimeoutError("the reply did not finish")


def send(page, text: str) -> None:
    page.fill("#msg-input textarea", text)
    page.press("#msg-input textarea", "Enter")


def main(url: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 820})
        page.goto(f"{url}/")
        page.wait_for_selector("#msg-input textarea", timeout=60_000)
        send(page, "Give me three tips for a good night's sleep.")
        wait_for_stats(page, 1)
        page.click("#new-chat-btn")
        send(page, "What is the capital of France?")
        wait_for_stats(page, 1)
        page.locator(
            "#chatbot .message-row"
        ).last.hover()  # Retry sits under the reply's stats line
        page.click("#chatbot button[aria-label='Retry']")
        time.sleep(1)
        wait_for_stats(page, 1)
        time.sleep(1.5)
        page.screenshot(path=str(OUT))
        browser.close()
    print(OUT)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:1919")
