"""`minisgl-chat bench page`: the token rate of a reply in the chat page against the same reply
through the OpenAI API of the same app, to see what the page's own work costs (its render of the
stream in the server, the browser drawing it on the same cores).

It starts the app (`minisgl-chat chat --no-browser`, a temporary data folder) unless ``--url``
names a running one. First ``--replies`` greedy replies through ``/v1/chat/completions`` with no
page open (streamed, timed by this process from its first to its last token), then, with the page
open in Debian's Chromium (Playwright), alternately one through the API and one through the page
(tok/s as the page's stats line shows it, measured in the app the same way: tokens after the
first over the time since the first). Same prompt, temperature 0 and max tokens everywhere, so
every reply is the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from minisgl_engine import UserError

DEFAULT_PROMPT = "Write a very long story about a dragon who learns to cook. Use many chapters."
STATS_LINE = re.compile(r"([\d.]+) tok/s · (\d+) tokens")


def add_page_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="a running app: the link it printed, with its ?token= (default: start one with --app-args)",
    )
    parser.add_argument(
        "--app-args",
        default="--device cpu",
        help="arguments of the `minisgl-chat chat` this bench starts (default: %(default)r)",
    )
    parser.add_argument(
        "--replies",
        type=int,
        default=3,
        help="replies per path, alternating (default: %(default)s)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="tokens per reply (default: %(default)s)"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument(
        "--chromium", default="/usr/bin/chromium", help="the browser (default: %(default)s)"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("MINISGL_API_KEY"),
        help="the app's API key, if it has one",
    )


@dataclass
class StartedApp:
    """A `minisgl-chat` this bench started: the page's link (…/?token=KEY; the server's address
    for `serve`), its process, how long it took from the command to /health 200, and its log."""

    link: str
    proc: subprocess.Popen
    ready_s: float
    log_path: str = ""


@contextmanager
def started_app(
    app_args: str, command: str = "chat", pythonpath: str | None = None
) -> Iterator[StartedApp]:
    """`minisgl-chat chat` (or ``command``) on a free port with its own data folder.
    ``pythonpath``: a folder holding another checkout's packages (``minisgl_app``,
    ``minisgl_engine``), put first on the app's path: the same bench run against another commit."""
    from minisgl_engine import free_port

    with tempfile.TemporaryDirectory(prefix="minisgl-bench-app-") as data:
        port = free_port()
        extra = ["--no-browser"] if command == "chat" else []
        cmd = [
            sys.executable,
            "-m",
            "minisgl_app.cli",
            command,
            *extra,
            "--port",
            str(port),
            *shlex.split(app_args),
        ]
        env = {**os.environ, "MINISGL_DATA_DIR": data}
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
        log_path = os.path.join(data, "app.log")
        log = open(log_path, "w")
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, log_path)
            ready_s = time.perf_counter() - start
            with open(log_path) as f:
                found = re.search(r"open (http://\S+) in your browser", f.read())
            yield StartedApp(found.group(1) if found else f"{url}/", proc, ready_s, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def wait_healthy(url: str, proc: subprocess.Popen, log_path: str, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(
                f"the app exited ({proc.returncode}) before it was ready; its log: {log_path}"
            )
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise UserError(f"the app was not ready after {timeout:.0f} s; its log: {log_path}")


def api_reply(url: str, prompt: str, max_tokens: int, api_key: str | None) -> dict:
    """One streamed chat completion; tok/s from this side of the socket."""
    import httpx

    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    first = last = None
    tokens = 0
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600
    ) as resp:
        if resp.status_code != 200:
            raise UserError(
                f"the API answered {resp.status_code}: {resp.read().decode(errors='replace')[:300]}"
            )
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                last = time.perf_counter()
                first = first or last
    rate = (tokens - 1) / (last - first) if first and last and last > first and tokens > 1 else None
    return {"path": "api", "tokens": tokens, "tok_s": rate}


class PageDriver:
    """The chat page in one Chromium tab, used as a person would."""

    def __init__(self, browser, link: str) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 860})
        self.page.goto(link)
        self.page.wait_for_selector("#msg-input textarea", timeout=120_000)
        self.page.wait_for_function(
            "document.querySelector('#status-line')?.innerText.includes('running')", timeout=60_000
        )

    def reply(self, prompt: str, max_tokens: int) -> dict:
        page = self.page
        page.click("#new-chat-btn")
        page.wait_for_function(
            "!document.querySelector('#chatbot [data-testid=\"user\"]')", timeout=30_000
        )
        if not page.locator("#max-tokens input").is_visible():
            page.get_by_text("Settings", exact=True).first.click()
        page.fill("#temperature input[type=number]", "0")
        page.fill("#max-tokens input", str(max_tokens))
        page.fill("#repetition-penalty input[type=number]", "1")  # the API's request: no penalty
        page.wait_for_timeout(500)  # the settings are saved as they change
        page.fill("#msg-input textarea", prompt)
        page.press("#msg-input textarea", "Enter")
        page.wait_for_function(
            "/tok\\/s · \\d+ tokens/.test(document.querySelector('#chatbot').innerText)",
            timeout=600_000,
        )
        found = STATS_LINE.search(page.inner_text("#chatbot"))
        assert found is not None
        return {"path": "page", "tokens": int(found.group(2)), "tok_s": float(found.group(1))}


def run_page_bench(args: argparse.Namespace) -> int:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError(
            "bench page drives a browser: pip install playwright (and apt-get install chromium)"
        ) from None
    if not os.path.exists(args.chromium):
        raise UserError(
            f"no browser at {args.chromium}: apt-get install chromium, or pass --chromium PATH"
        )
    rows = []
    with ExitStack() as stack:
        link = (
            args.url or stack.enter_context(started_app(args.app_args)).link
        )  # the page's link (…/?token=KEY)
        url = server_url(link)
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(
            executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        stack.callback(browser.close)
        api_reply(
            url, "Say hello.", 8, args.api_key
        )  # warm-up: first-call costs stay out of the figures

        def record(row: dict, run: int) -> None:
            row["run"] = run
            rows.append(row)
            print(json.dumps(row), flush=True)

        for i in range(args.replies):  # the API with no page open
            record(
                api_reply(url, args.prompt, args.max_tokens, args.api_key) | {"path": "api_alone"},
                i,
            )
        page = PageDriver(browser, link)
        for i in range(
            args.replies
        ):  # then the page open: the API while it idles, and the page itself
            record(api_reply(url, args.prompt, args.max_tokens, args.api_key), i)
            record(page.reply(args.prompt, args.max_tokens), i)
    summary = summarize(rows)
    print(json.dumps(summary))
    print(
        f"median tok/s: API {summary['api_alone_tok_s']:.1f} with no page open, {summary['api_tok_s']:.1f} with the page "
        f"open; the page {summary['page_tok_s']:.1f} ({summary['page_vs_api']:.0%} of the API)"
    )
    return 0


def server_url(link: str) -> str:
    """``http://host:port`` of a page link (its path and ``?token=`` dropped): where /v1 is."""
    from urllib.parse import urlsplit

    parts = urlsplit(link)
    return f"{parts.scheme}://{parts.netloc}"


def summarize(rows: list[dict]) -> dict:
    def median(path: str) -> float:
        rates = [r["tok_s"] for r in rows if r["path"] == path and r["tok_s"]]
        if not rates:
            raise UserError(f"no {path} reply had two tokens or more; raise --max-tokens")
        return statistics.median(rates)

    alone, api, page = median("api_alone"), median("api"), median("page")
    return {
        "bench": "page",
        "api_alone_tok_s": round(alone, 1),
        "api_tok_s": round(api, 1),
        "page_tok_s": round(page, 1),
        "page_vs_api": round(page / api, 3),
        "page_vs_api_alone": round(page / alone, 3),
        "tokens": sorted({r["tokens"] for r in rows}),
    }
