"""`minisgl-chat bench footprint`: what the app costs a machine, measured as a user starts it.

It starts `minisgl-chat chat --no-browser` (or `serve`) on a temporary data folder ``--starts``
times; each start's time from the command to ``/health`` 200 is reported (the first may read the
model from disk; later ones are warm starts). On the last start it waits ``--settle`` seconds and
reads every process of the app (the front end and each worker, by process title) from /proc:
RSS and PSS (PSS splits a page shared by N processes N ways, so the sum over processes is what
the app holds). Then one long chat (``--chat-tokens`` of prompt through ``/v1/chat/completions``)
with the same figures sampled while it runs (the peak of the sum) and after it, and the
machine's 1-minute load average before and after (other work on it slows the starts). With
``--page``, the time Chromium takes to show the page once the server is ready. One JSON line, for
docs/benchmarks.md; on a GPU it adds the GPU memory each process holds (nvidia-smi) and the
CUDA graphs captured at start-up (count and seconds, from the ready line). ``--pythonpath`` runs another checkout (a folder with its ``minisgl_app`` and
``minisgl_engine``) for a before/after in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable

from minisgl_engine import UserError

from .bench_page import StartedApp, server_url, started_app

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "
TOKENS_PER_SENTENCE = (
    14  # SmolLM2's and Llama 3's tokenizers; the reply's usage says the true count
)
SAMPLE_EVERY_S = 0.25


def add_footprint_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--app",
        dest="app_command",
        choices=("chat", "serve"),
        default="chat",
        help="what to start (default: %(default)s)",
    )
    parser.add_argument(
        "--app-args", default="--device cpu", help="its arguments (default: %(default)r)"
    )
    parser.add_argument(
        "--starts",
        type=int,
        default=2,
        help="starts, one after another; memory is read on the last (default: %(default)s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="seconds idle after the start before memory is read (default: %(default)s)",
    )
    parser.add_argument(
        "--chat-tokens",
        type=int,
        default=8000,
        help="prompt tokens of the long chat; 0: none (default: %(default)s)",
    )
    parser.add_argument(
        "--page", action="store_true", help="also time the chat page's first load in Chromium"
    )
    parser.add_argument(
        "--chromium",
        default="/usr/bin/chromium",
        help="the browser for --page (default: %(default)s)",
    )
    parser.add_argument(
        "--pythonpath",
        help="a folder with another checkout's minisgl_app and minisgl_engine, run instead",
    )
    parser.add_argument(
        "--label", default="", help="a name for this run in the JSON line (e.g. a commit)"
    )


def process_memory(app: StartedApp) -> dict[str, dict[str, float]]:
    """Process title -> RSS and PSS in MB, for the app's process and all its descendants."""
    import psutil

    root = psutil.Process(app.proc.pid)
    found: dict[str, dict[str, float]] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            title = (proc.cmdline() or [proc.name()])[0].split("/")[-1]
            if proc.pid == root.pid:
                title = "front end"
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        name = title if title not in found else f"{title} ({proc.pid})"
        found[name] = {"rss_mb": round(info.rss / 2**20, 1), "pss_mb": round(info.pss / 2**20, 1)}
    return found


def gpu_memory(app: StartedApp) -> dict[str, float]:
    """Process title -> GPU memory in MB (nvidia-smi's per-process figure, CUDA context
    included) for the app's processes that hold any; empty without nvidia-smi."""
    import shutil
    import subprocess

    import psutil

    if shutil.which("nvidia-smi") is None:
        return {}
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    used = {
        int(pid): float(mb)
        for pid, mb in (line.split(",") for line in out.splitlines() if "," in line)
    }
    root = psutil.Process(app.proc.pid)
    found: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        if proc.pid in used:
            try:
                title = (proc.cmdline() or [proc.name()])[0].split("/")[-1]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            found["front end" if proc.pid == root.pid else title] = used[proc.pid]
    return found


def cuda_graphs(app: StartedApp) -> dict[str, float]:
    """The ready line's "N CUDA graphs captured in T s" (nothing on CPU)."""
    import re

    with open(app.log_path) as f:
        found = re.search(r"(\d+) CUDA graphs captured in ([\d.]+) s", f.read())
    return (
        {"cuda_graphs": int(found.group(1)), "graph_capture_s": float(found.group(2))}
        if found
        else {}
    )


def total_pss(processes: dict[str, dict[str, float]]) -> float:
    return round(sum(p["pss_mb"] for p in processes.values()), 1)


def long_chat(url: str, tokens: int) -> tuple[dict, Callable[[], None]]:
    """One chat of about ``tokens`` prompt tokens and a few reply tokens: the dict its outcome is
    written into (``status``, ``answer``) and the function that sends it."""
    import httpx

    text = SENTENCE * max(1, tokens // TOKENS_PER_SENTENCE)
    body = {
        "messages": [{"role": "user", "content": text + "\nSummarize this in one line."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    result: dict = {}

    def send() -> None:
        resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
        result["status"] = resp.status_code
        result["answer"] = resp.json()

    return result, send


def sample_while(app: StartedApp, work: Callable[[], None]) -> dict[str, dict[str, float]]:
    """Run ``work`` in a thread; the largest summed PSS seen while it ran, with its processes."""
    thread = threading.Thread(target=work, daemon=True)
    peak: dict[str, dict[str, float]] = {}
    thread.start()
    while thread.is_alive():
        seen = process_memory(app)
        if total_pss(seen) > total_pss(peak):
            peak = seen
        time.sleep(SAMPLE_EVERY_S)
    thread.join()
    return peak


def page_load_s(link: str, chromium: str) -> float:
    """Seconds from opening the page's link to its chat list drawn (the page marks itself loaded)."""
    if not os.path.exists(chromium):
        raise UserError(
            f"no browser at {chromium}: apt-get install chromium, or pass --chromium PATH"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            start = time.perf_counter()
            page.goto(link)
            page.wait_for_function("document.body.dataset.chatLoaded === '1'", timeout=120_000)
            return round(time.perf_counter() - start, 2)
        finally:
            browser.close()


def run_footprint_bench(args: argparse.Namespace) -> int:
    if args.starts < 1:
        raise UserError("--starts must be 1 or more")
    ready: list[float] = []
    row: dict = {
        "bench": "footprint",
        "label": args.label,
        "app": args.app_command,
        "app_args": args.app_args,
        # what else the machine ran: the ready times of a shared machine move with it
        "load_avg_1m": [round(os.getloadavg()[0], 2)],
    }
    for start in range(args.starts):
        with started_app(args.app_args, args.app_command, args.pythonpath) as app:
            ready.append(round(app.ready_s, 2))
            if start < args.starts - 1:
                continue
            if args.page and args.app_command == "chat":
                row["page_load_s"] = page_load_s(app.link, args.chromium)
            time.sleep(args.settle)
            idle = process_memory(app)
            row.update(idle_pss_mb=total_pss(idle), idle=idle, **cuda_graphs(app))
            gpu = gpu_memory(app)
            if gpu:
                row.update(idle_gpu_mb=round(sum(gpu.values()), 1), idle_gpu=gpu)
            if args.chat_tokens > 0:
                result, send = long_chat(server_url(app.link), args.chat_tokens)
                peak = sample_while(app, send)
                if result.get("status") != 200:
                    raise UserError(
                        f"the long chat was answered {result.get('status')}: {str(result.get('answer'))[:300]}"
                    )
                after = process_memory(app)
                row.update(
                    chat_prompt_tokens=result["answer"]["usage"]["prompt_tokens"],
                    chat_peak_pss_mb=total_pss(peak),
                    chat_peak=peak,
                    after_chat_pss_mb=total_pss(after),
                    after_chat=after,
                )
    row["ready_s"] = ready
    row["load_avg_1m"].append(round(os.getloadavg()[0], 2))
    print(json.dumps(row), flush=True)
    return 0
