"""A stand-in for the Hugging Face Hub on loopback, for tests that download (nothing may reach the
real hub at test time). huggingface_hub's own client talks to it when ``HF_ENDPOINT`` names it, so
a pull runs the real download code: the repository info, its file listing, then each file.

It serves the repositories of *origin* folders laid out as huggingface_hub's cache
(``models--org--name/snapshots/<commit>/...``, as tests/tiny_models.py writes them). A repository
none holds answers 404 (RepositoryNotFoundError in the client). ``bytes_per_s`` slows the
file bodies down so that a test can see progress and cancel midway.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 64 * 1024


class FakeHub:
    def __init__(self, *origins: Path, bytes_per_s: float | None = None) -> None:
        self.origins = [Path(o) for o in origins]
        self.bytes_per_s = bytes_per_s
        self.requests: list[str] = []  # "GET /api/models/..." as they came
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the test output is for failures
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- the repositories

    def snapshot(self, repo_id: str) -> tuple[str, Path] | None:
        """(commit, folder) of ``repo_id`` in the first origin that holds it, or None."""
        for origin in self.origins:
            repo = origin / f"models--{repo_id.replace('/', '--')}"
            ref = repo / "refs" / "main"
            if ref.is_file():
                commit = ref.read_text().strip()
                return commit, repo / "snapshots" / commit
        return None

    @staticmethod
    def files(folder: Path) -> list[Path]:
        return sorted(p for p in folder.rglob("*") if p.is_file())

    @staticmethod
    def etag(path: Path) -> str:
        return hashlib.sha1(path.read_bytes()).hexdigest()

    # ---- the routes huggingface_hub calls

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            return self.api(handler, parts[2:])
        if len(parts) >= 5 and parts[2] == "resolve":  # /org/name/resolve/<revision>/<file>
            return self.resolve(handler, "/".join(parts[:2]), "/".join(parts[4:]), body)
        self.send(handler, 404, {"error": "not found"})

    def api(self, handler: BaseHTTPRequestHandler, rest: list[str]) -> None:
        """/api/models/org/name/revision/<rev> and /api/models/org/name/tree/<rev>[/...]"""
        repo_id = "/".join(rest[:2])
        found = self.snapshot(repo_id)
        if found is None:
            return self.send(
                handler,
                404,
                {"error": "Repository not found"},
                headers={"X-Error-Code": "RepoNotFound"},
            )
        commit, folder = found
        kind = rest[2] if len(rest) > 2 else "revision"
        if kind == "tree":
            listing = [
                {
                    "type": "file",
                    "oid": self.etag(f),
                    "size": f.stat().st_size,
                    "path": str(f.relative_to(folder)),
                }
                for f in self.files(folder)
            ]
            return self.send(handler, 200, listing)
        siblings = [{"rfilename": str(f.relative_to(folder))} for f in self.files(folder)]
        self.send(
            handler,
            200,
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "siblings": siblings,
                "private": False,
            },
        )

    def resolve(
        self, handler: BaseHTTPRequestHandler, repo_id: str, filename: str, body: bool
    ) -> None:
        found = self.snapshot(repo_id)
        path = found[1] / filename if found else None
        if path is None or not path.is_file():
            return self.send(
                handler,
                404,
                {"error": "Entry not found"},
                headers={"X-Error-Code": "EntryNotFound"},
            )
        data = path.read_bytes()
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("ETag", f'"{self.etag(path)}"')
        handler.send_header("X-Repo-Commit", found[0])
        handler.send_header("Content-Type", "application/octet-stream")
        handler.end_headers()
        if not body:
            return
        try:
            for start in range(0, len(data), CHUNK):
                handler.wfile.write(data[start : start + CHUNK])
                if self.bytes_per_s:
                    time.sleep(CHUNK / self.bytes_per_s)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a cancelled pull)

    @staticmethod
    def send(
        handler: BaseHTTPRequestHandler, status: int, payload, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
