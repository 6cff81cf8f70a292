"""Start real `minisgl-chat serve` processes for tests and read their /metrics."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

CLI = [sys.executable, "-m", "minisgl_app.cli"]


# The demo servers' engine budget (conftest.demo_server, the soak suite's chat app): a small
# chunked-prefill budget, so that a long prompt spends several steps in chunked prefill (the
# abort storms end requests there, and every test's replies go through chunking).
MAX_PREFILL_TOKENS = 64
MAX_KV_TOKENS = 16384


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        *args: str,
        log_path: Path | None = None,
        timeout: float = 180.0,
        command: str = "serve",
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        # port 0: the server picks one and says which in its "ready at" line (needs log_path)
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        # the CPU engine (the test machines have no GPU); with --remote there is no engine to place
        device = [] if "--remote" in args and "--local" not in args else ["--device", "cpu"]
        cmd = [*CLI, command, "--port", str(self.port), *device, *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.output()}")
            if self.port == 0:
                found = re.search(r"ready at http://127\.0\.0\.1:(\d+)", self.output())
                if found is None:
                    time.sleep(0.2)
                    continue
                self.port = int(found.group(1))
                self.url = f"http://127.0.0.1:{self.port}"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout} s: {self.output()}")

    @property
    def page_url(self) -> str:
        """The link the chat app prints for its page (…/?token=KEY): what opens it logged in."""
        found = re.search(
            r"open (http://\S+) in your browser", self.log_path.read_text(errors="replace")
        )
        assert found, f"the app printed no link to its page: {self.output()}"
        return found.group(1)

    @property
    def page_cookies(self) -> dict[str, str]:
        """The cookie a browser gets from that link, for HTTP clients that call the page's routes."""
        from urllib.parse import parse_qs, urlsplit

        [key] = parse_qs(urlsplit(self.page_url).query)["token"]
        return {f"minisgl-page-{self.port}": key}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path else ""

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.log_path and not self.log.closed:
            self.log.close()


def served_model(url: str) -> str:
    """The name /v1/models lists: what a request's `model` must say (any other is a 404)."""
    [model] = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return model["id"]


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def titles(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()))
        except psutil.Error:
            pass
    return out


def kill_worker_and_expect_the_app_to_end(srv: ServerProcess, title: str, message: str) -> None:
    """SIGKILL the worker titled ``title``: the app must exit non-zero within 5 s with ``message``
    in its log, and every worker must be gone 5 s later."""
    import signal

    workers = srv.workers()
    [victim] = [p for p in workers if title in " ".join(p.cmdline())]
    start = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    assert srv.proc.wait(5) != 0
    print(f"the app exited {time.monotonic() - start:.2f} s after {title} was killed")
    assert message in srv.output()
    assert wait_until(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers), 5.0
    )


def group_gone(procs: list[psutil.Process]) -> bool:
    """No process of ``procs`` is left (a zombie waiting for its parent's wait() counts as gone)."""
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def ipc_socket_paths(srv: ServerProcess) -> list[str]:
    """The AF_UNIX paths the server's processes have bound (its ZeroMQ ipc:// endpoints)."""
    paths: set[str] = set()
    for proc in [psutil.Process(srv.proc.pid), *srv.workers()]:
        paths |= {c.laddr for c in proc.net_connections(kind="unix") if c.laddr}
    return sorted(paths)


def runtime_dir_of(srv: ServerProcess) -> Path:
    """The server's private runtime folder (engine/workers/ipc.py make_runtime_dir): the one
    folder holding all of its ZeroMQ sockets (the fork server's own socket sits in
    multiprocessing's private folder: engine/workers/launcher.py)."""
    paths: set[str] = set()
    for proc in [psutil.Process(srv.proc.pid), *srv.workers()]:
        if "minisgl-fork-server" not in " ".join(proc.cmdline()):
            paths |= {c.laddr for c in proc.net_connections(kind="unix") if c.laddr}
    [folder] = {Path(p).parent for p in paths}
    return folder
