"""Security of a running server: another local user cannot connect to its IPC sockets, /health
and /metrics reveal no prompt text, and oversized or hostile requests are refused while others
are served (issue 41). (Covered elsewhere: the 0700 runtime folder in
tests/server/test_server.py, the 0600 chat database in tests/unit/test_store.py, the UI's login wall in
tests/browser/test_browser.py, 401 on /v1/* in tests/unit/test_openai_api.py and tests/server/test_server.py.)"""

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
    subprocess.run(
        [
            "useradd",
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "--user-group",
            name,
        ],
        check=True,
        capture_output=True,
    )
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
    assert (
        stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700
        and runtime_dir.stat().st_uid == os.getuid()
    )
    assert all(stat.S_ISSOCK(os.stat(p).st_mode) for p in paths)

    # control: the same probe, as the same user, reaches a socket it is allowed to use, so a
    # PermissionError below is the runtime folder's doing and not a broken probe
    with (
        tempfile.TemporaryDirectory() as open_dir,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener,
    ):
        os.chmod(open_dir, 0o777)
        allowed = os.path.join(open_dir, "open")
        listener.bind(allowed)
        os.chmod(allowed, 0o777)
        listener.listen(1)
        assert connect_as(other_user, [allowed]) == {allowed: "connected"}

    assert connect_as(other_user, paths) == {p: "PermissionError" for p in paths}
    # and the server is unharmed
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions",
        json=chat_body("Say hi.", max_tokens=2),
        timeout=120,
    )
    assert r.status_code == 200, r.text


def test_health_and_metrics_reveal_no_prompt_text(soak_server):
    """One prompt finished, one streaming while /health and /metrics are read: neither shows up."""
    done_marker, live_marker = f"zqx{uuid.uuid4().hex}", f"zqy{uuid.uuid4().hex}"
    r = httpx.post(
        f"{soak_server.url}/v1/chat/completions",
        json=chat_body(f"Spell {done_marker}.", max_tokens=4),
        timeout=120,
    )
    assert r.status_code == 200, r.text
    streaming, stop = threading.Event(), threading.Event()

    def stream() -> None:
        body = chat_body(
            f"Tell a long story about {live_marker}.", max_tokens=400, ignore_eos=True, stream=True
        )
        with httpx.stream(
            "POST", f"{soak_server.url}/v1/chat/completions", json=body, timeout=120
        ) as resp:
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
        pages = {
            route: httpx.get(f"{soak_server.url}{route}", timeout=10)
            for route in ("/health", "/metrics")
        }
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


def scheduler_rss(srv) -> int:
    [scheduler] = [p for p in srv.workers() if "minisgl-TP0-scheduler" in " ".join(p.cmdline())]
    return scheduler.memory_info().rss


def test_oversized_and_hostile_requests_are_refused_while_another_client_is_served(soak_server):
    """Issue 41 (items 3-5): thrown at once, a 10,000-property JSON schema (400: too many
    properties, never compiled), a 100 MB body (413 from its Content-Length, never read), a 5 MB
    message (400: more characters than the context could hold, never tokenized) and a chat
    template that loops 10^10 times (400: this server takes no request templates). Meanwhile a
    normal request from another client is answered promptly, and afterwards the engine is idle
    (0 running, 0 KV pages used) with the scheduler's memory where it was."""
    import asyncio
    import time

    url = soak_server.url
    assert_idle(soak_server)
    rss_before = scheduler_rss(soak_server)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
    huge = b'{"messages": [{"role": "user", "content": "' + b"a" * (100 * 1024 * 1024) + b'"}]}'

    async def attack(client: httpx.AsyncClient, **kw) -> int | str:
        try:
            r = await client.post(f"{url}/v1/chat/completions", **kw)
        except (
            httpx.TransportError
        ) as exc:  # the server may close the connection while a 100 MB body is still being sent
            return type(exc).__name__
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
        return r.status_code

    async def normal() -> float:
        await asyncio.sleep(0.5)  # the attacks are in flight
        async with httpx.AsyncClient(timeout=60) as other:
            start = time.monotonic()
            r = await other.post(
                f"{url}/v1/chat/completions", json=chat_body("Say hi.", max_tokens=8)
            )
            took = time.monotonic() - start
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        return took

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                attack(
                    client,
                    json=chat_body(
                        "Fill it in.",
                        max_tokens=64,
                        response_format={
                            "type": "json_schema",
                            "json_schema": {"name": "big", "schema": schema},
                        },
                    ),
                ),
                attack(client, content=huge, headers={"content-type": "application/json"}),
                attack(client, json=chat_body("a" * (5 * 1024 * 1024), max_tokens=8)),
                attack(
                    client,
                    json=chat_body(
                        "Hi.", max_tokens=8, chat_template_kwargs={"chat_template": looping}
                    ),
                ),
                normal(),
            )

    start = time.monotonic()
    *refusals, took = asyncio.run(main())
    print(
        f"refusals {refusals} in {time.monotonic() - start:.2f} s; the other client's request took {took:.2f} s"
    )
    assert refusals[0] == 400 and refusals[2] == 400 and refusals[3] == 400, refusals
    assert refusals[1] in (413, "WriteError", "RemoteProtocolError", "ReadError"), refusals
    assert took < 10, f"another client waited {took:.1f} s"
    m = assert_idle(soak_server)
    assert m["minisgl_running_requests"] == 0 and m["minisgl_kv_pages_used"] == 0, m
    rss_after = scheduler_rss(soak_server)
    print(f"scheduler RSS {rss_before / 2**20:.0f} MiB before, {rss_after / 2**20:.0f} MiB after")
    assert abs(rss_after - rss_before) <= 0.1 * rss_before, (rss_before, rss_after)
