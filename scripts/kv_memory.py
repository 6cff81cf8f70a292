"""The scheduler process's memory over a chat's life (docs: issue 44, KV memory that grows with use).

Starts ``minisgl-chat serve`` on CPU with the demo model, and reads the scheduler's RSS and PSS
(/proc/PID/smaps_rollup): idle after start, the peak while a long chat runs, just after it, after
``--idle`` seconds of idleness (when the scheduler has given free KV pages back) and, with
``--long-idle``, after that many (past IDLE_CACHE_EVICT_S: the prefix cache's pages too).

    PYTHONPATH=.pkgs .venv/bin/python scripts/kv_memory.py [--prompt-tokens 8000] [--idle 15] [--long-idle 610] [-- serve flags]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

WORDS = (
    "the river runs past the old mill where the miller keeps his grain and the children play by the water "
    "while the town sleeps under a grey sky "
).split()


def memory_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        if name in ("Rss", "Pss", "Anonymous"):
            fields[name.lower()] = int(value.split()[0])
    return fields


def scheduler_pid(server: subprocess.Popen) -> int:
    for _ in range(600):
        for child in psutil.Process(server.pid).children(recursive=True):
            if " ".join(child.cmdline()).startswith("minisgl-TP0-scheduler"):  # its process title
                return child.pid
        time.sleep(0.5)
    raise RuntimeError("no scheduler process")


def wait_ready(port: int) -> str:
    """The served model's id, once the engine is ready (/health answers 200, not 503)."""
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return json.loads(
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            )["data"][0]["id"]
        except OSError:  # not listening yet, or 503 while starting
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def chat(port: int, model: str, prompt_tokens: int) -> dict:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(int(prompt_tokens * 0.95)))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text + "\nSummarise this."}],
        "max_tokens": 64,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=1200).read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=8000)
    parser.add_argument("--idle", type=float, default=15.0)
    parser.add_argument(
        "--long-idle",
        type=float,
        default=0.0,
        help="then read again after this many seconds idle in all (610: past the prefix cache's eviction)",
    )
    parser.add_argument("--port", type=int, default=19391)
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the server is stopped too
    command = [
        sys.executable,
        "-c",
        "from minisgl_app.cli import main; main()",
        "serve",
        "--port",
        str(args.port),
        "--device",
        "cpu",
        *args.serve_args,
    ]
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy()
    )
    try:
        model = wait_ready(args.port)
        pid = scheduler_pid(server)
        time.sleep(3)
        rows = {"idle_after_start": memory_kb(pid)}
        peak: dict[str, int] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                now = memory_kb(pid)
                if now["rss"] > peak.get("rss", 0):
                    peak.update(now)
                time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        reply = chat(args.port, model, args.prompt_tokens)
        done.set()
        sampler.join()
        rows["peak_during_chat"] = peak
        rows["just_after_chat"] = memory_kb(pid)
        time.sleep(args.idle)
        rows[f"after_{args.idle:g}s_idle"] = memory_kb(pid)
        if args.long_idle > args.idle:
            time.sleep(args.long_idle - args.idle)
            rows[f"after_{args.long_idle:g}s_idle"] = memory_kb(pid)
        rows["usage"] = reply["usage"]
        print(json.dumps(rows, indent=1))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
