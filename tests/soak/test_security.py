"""Security of a running server: another local user cannot connect to its IPC sockets, and /health
and /metrics reveal no prompt text. (Covered elsewhere: the 0700 runtime folder in
tests/test_server.py, the 0600 chat database in tests/test_store.py, the UI's login wall in
tests/test_browser.py, 401 on /v1/* in tests/test_openai_api.py and tests/test_server.py.)"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server_utils import wait_until
from soak_utils import assert_idle, chat_body, ipc_socket_paths, runtime_dir_of


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A throwaway system user (no home, no login shell), deleted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a throwaway user with useradd")
    if not (shutil.which("useradd") and shutil.which("userdel")):
        pytest.skip("needs useradd and userdel")
    name = f"msgl-{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def connect_as(user: pwd.struct_passwd, paths: list[str]) -> dict[str, str]:
    """{path: "connected" or the error's type} for an AF_UNIX connect to each path, made by a
    forked child that has dropped to ``user`` (no external tool, no interpreter it must reach)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the other user, try each path, report, leave at once
        out: dict[str, str] = {}
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            for path in paths:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    try:
                        s.connect(path)
                        out[path] = "connected"
                    except OSError as exc:
                        out[path] = type(exc).__name__
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised here
            out = {"child failed": repr(exc)}
        finally:
            os.write(write_fd, json.dumps(out).encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(report)


def test_another_local_user_cannot_connect_to_the_ipc_sockets(soak_server, other_user):
    paths = ipc_socket_paths(soak_server)
    names = {Path(p).name for p in paths}
    assert {"frontend", "scheduler-0", "detokenizer", "tokenizer-0"} <= names, paths
    runtime_dir = runtime_dir_of(soak_server)
    assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700 and runtime_dir.stat().st_uid == os.getuid()
    assert all(stat.S_ISSOCK(os.stat(p).st_mode) for p in paths)

    # control: the same probe, as the same user, reaches a socket it is allowed to use, so a
    # PermissionError below is the runtime folder's doing and not a broken probe
    with tempfile.TemporaryDirectory() as open_dir, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        os.chmod(open_dir, 0o777)
        allowed = os.path.join(open_dir, "open")
        listener.bind(allowed)
        os.chmod(allowed, 0o777)
        listener.listen(1)
        assert connect_as(other_user, [allowed]) == {allowed: "connected"}

    assert connect_as(other_user, paths) == {p: "PermissionError" for p in paths}
    # and the server is unharmed
    r = httpx.post(f"{soak_server.url}/v1/chat/completions", json=chat_body("Say hi.", max_tokens=2), timeout=120)
    assert r.status_code == 200, r.text


def test_health_and_metrics_reveal_no_prompt_text(soak_server):
    """One prompt finished, one streaming while /health and /metrics are read: neither shows up."""
    done_marker, live_marker = f"zqx{uuid.uuid4().hex}", f"zqy{uuid.uuid4().hex}"
    r = httpx.post(f"{soak_server.url}/v1/chat/completions", json=chat_body(f"Spell {done_marker}.", max_tokens=4), timeout=120)
    assert r.status_code == 200, r.text
    streaming, stop = threading.Event(), threading.Event()

    def stream() -> None:
        body = chat_body(f"Tell a long story about {live_marker}.", max_tokens=400, ignore_eos=True, stream=True)
        with httpx.stream("POST", f"{soak_server.url}/v1/chat/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if '"content"' in line:
                    streaming.set()
                if stop.is_set():
                    return

    client = threading.Thread(target=stream, daemon=True)
    client.start()
    try:
        assert streaming.wait(60), "the stream never started"
        assert soak_server.metrics()["minisgl_running_requests"] >= 1
        pages = {route: httpx.get(f"{soak_server.url}{route}", timeout=10) for route in ("/health", "/metrics")}
    finally:
        stop.set()
        client.join(30)
    assert pages["/health"].status_code == 200 and pages["/metrics"].status_code == 200
    for route, page in pages.items():
        for marker in (done_marker, live_marker):
            assert marker not in page.text, route
            assert marker[3:] not in page.text, route  # nor the bare hex id
    assert wait_until(lambda: soak_server.metrics()["minisgl_running_requests"] == 0, 30)
    assert_idle(soak_server)
