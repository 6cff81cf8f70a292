"""The page's file uploads over HTTP, as the page sends them (Gradio's /gradio_api/upload, then
the event through /gradio_api/queue/join and its stream), against the real app (conftest's
chat_app): what Attach and Import read, and how large an upload may be (issue 41, items 1 and 8).

``page_session`` is the one place that makes the page's HTTP session: a login the page may
require (a cookie) goes there."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import requests

from minisgl_app.chat.uploads import NOT_UPLOADED, UPLOAD_LIMIT_BYTES


@pytest.fixture
def app(chat_app):
    return chat_app


def page_session(app) -> requests.Session:
    """An HTTP session of the page's own (what the browser holds after loading it: the page key's cookie)."""
    http = requests.Session()
    http.cookies.update(app.page_cookies)
    return http


def event_of(config: dict, elem_id: str, trigger: str) -> tuple[int, int]:
    """(fn_index, component id) of the page's event ``trigger`` on the component ``elem_id``."""
    component = next(
        c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id
    )
    dep = next(
        d for d in config["dependencies"] if [component, trigger] in [list(t) for t in d["targets"]]
    )
    return dep["id"], component


def run_event(
    app, http: requests.Session, session: str, elem_id: str, trigger: str, data: list
) -> list[dict]:
    """Join the queue for one event as the page does and read its stream to the end: the messages."""
    config = http.get(f"{app.url}/config", timeout=10).json()
    fn_index, component = event_of(config, elem_id, trigger)
    body = {
        "data": data,
        "fn_index": fn_index,
        "session_hash": session,
        "trigger_id": component,
        "event_data": None,
    }
    r = http.post(f"{app.url}/gradio_api/queue/join", json=body, timeout=10)
    assert r.status_code == 200, r.text[:300]
    seen = []
    with http.get(
        f"{app.url}/gradio_api/queue/data",
        params={"session_hash": session},
        stream=True,
        timeout=30,
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith(b"data: "):
                seen.append(json.loads(line[6:]))
                if seen[-1]["msg"] in ("process_completed", "close_stream", "unexpected_error"):
                    break
    return seen


def upload(app, http: requests.Session, name: str, body: bytes) -> requests.Response:
    return http.post(f"{app.url}/gradio_api/upload", files={"files": (name, body)}, timeout=60)


def file_data(path: str, name: str) -> dict:
    return {"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def warnings_in(messages: list[dict]) -> list[str]:
    return [m.get("log", "") for m in messages if m.get("msg") == "log"]


def completed(messages: list[dict]) -> dict:
    return next(m for m in messages if m["msg"] == "process_completed")


def output_of(messages: list[dict]) -> list:
    done = completed(messages)
    assert done.get("success"), done
    return done["output"]["data"]


def shown_by(messages: list[dict]) -> list:
    """What the event gave the page to show (nothing when it failed: Gradio's error names the path sent)."""
    done = completed(messages)
    return done["output"]["data"] if done.get("success") else []


def refused(messages: list[dict]) -> bool:
    """An event's file refused: by Gradio's own check (the event fails before the handler), or by
    the handler's (app/chat/uploads.py: a warning, nothing read)."""
    return not completed(messages).get("success") or any(
        NOT_UPLOADED in w for w in warnings_in(messages)
    )


def test_attach_refuses_a_forged_file_path_and_reads_an_uploaded_file_once(app, tmp_path):
    """Issue 41, item 1: a FileData naming a server path (not uploaded) sent to Attach through
    queue/join was accepted: Gradio copied the file into its cache and the page attached it. It is
    refused with a message, nothing is attached, and no copy of it stays in the app's files
    folder; a file uploaded through the page's route is attached, then deleted."""
    http = page_session(app)
    session = f"forged{uuid.uuid4().hex[:10]}"
    secret = tmp_path / "secret-41.txt"
    secret.write_text("the PIN is 4321\n", encoding="utf-8")
    messages = run_event(
        app, http, session, "attach-btn", "upload", [[file_data(str(secret), secret.name)]]
    )
    assert refused(messages) and "secret-41" not in json.dumps(shown_by(messages)), messages
    r = upload(app, http, "notes-41.txt", b"the code is plum\n")
    assert r.status_code == 200, r.text[:300]
    [stored] = r.json()
    folder = Path(stored).parent.parent  # the app's private files folder (GRADIO_TEMP_DIR)
    app.files_seen.append(folder)
    messages = run_event(
        app, http, session, "attach-btn", "upload", [[file_data(stored, "notes-41.txt")]]
    )
    note = output_of(messages)[0]
    assert "notes-41.txt" in json.dumps(note) and "secret-41" not in json.dumps(note), note
    assert not Path(stored).exists(), "the uploaded file stays after it was attached"
    assert not list(folder.rglob("secret-41.txt")), (
        "Gradio's copy of the forged path stays in the files folder"
    )


def test_a_forged_file_path_is_refused_before_gradio_reads_it(app, tmp_path):
    """Issue 41, item 1: before the handler runs, Gradio's preprocessing read the file an event
    names (hashing it) and copied it into its cache: a forged "/dev/zero" would hang the server,
    a large file fill the disk. Mounted, Gradio skipped its own check that the file lies in its
    upload folder; switched on (ChatPage.build), a path elsewhere is refused unread. A named pipe
    shows it: reading it would block until a writer comes; no reader ever opens it here."""
    import os
    import threading

    pipe = tmp_path / "pipe-41.txt"
    os.mkfifo(pipe)
    opened: list[bool] = []

    def watch() -> None:  # a reader blocked on the pipe is let go (the app must not stay hung)
        for _ in range(100):
            try:
                fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader
                time.sleep(0.1)
                continue
            opened.append(True)
            os.close(fd)
            return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    messages = run_event(
        app,
        page_session(app),
        f"fifo{uuid.uuid4().hex[:10]}",
        "attach-btn",
        "upload",
        [[file_data(str(pipe), pipe.name)]],
    )
    watcher.join()
    assert not opened, "Gradio opened the forged path to read it"
    assert refused(messages), messages


def test_import_refuses_a_forged_file_path(app, tmp_path):
    """Issue 41, item 1, for Import chat: a forged FileData naming a chat file on the server is
    refused with a message and nothing is imported."""
    http = page_session(app)
    session = f"forgedimport{uuid.uuid4().hex[:10]}"
    title = f"Forged import {time.time_ns()}"
    chat = tmp_path / "chat.json"
    chat.write_text(
        json.dumps({"title": title, "messages": [{"role": "user", "content": "hello"}]}),
        encoding="utf-8",
    )
    messages = run_event(
        app, http, session, "import-btn", "upload", [file_data(str(chat), chat.name), None, ""]
    )
    assert refused(messages) and title not in json.dumps(shown_by(messages)), messages


def test_an_upload_larger_than_the_import_limit_is_refused_by_the_upload_route(app):
    """Issue 41, item 8: Gradio's upload route took files of any size (200 MB in 1.8 s, kept
    until the app stopped); the page reads none larger than an import (20 MB). One byte more is
    refused with 413 before it is stored."""
    http = page_session(app)
    r = upload(app, http, "big.json", b" " * (UPLOAD_LIMIT_BYTES + 1))
    assert r.status_code == 413, (r.status_code, r.text[:200])
    r = upload(app, http, "small.json", b"{}")
    assert r.status_code == 200, r.text[:200]
