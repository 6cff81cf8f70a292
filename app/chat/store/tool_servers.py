"""The MCP servers the user added in the Tools panel (app/chat/tool_loop.py starts them)."""

from __future__ import annotations

import json
import time

from .base import StoreBase
from .records import NotFoundError, ToolServerRecord


class ToolServersMixin(StoreBase):
    """The tool-server methods of ConversationStore."""

    def add_tool_server(
        self,
        name: str,
        command: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        url: str | None = None,
    ) -> ToolServerRecord:
        """Remember a server: a stdio ``command`` (with ``args`` and ``env``) or a ``url``.
        ValueError for a name already taken, an empty name, or not exactly one of the two."""
        name = name.strip()
        if not name or "/" in name or len(name) > 60:
            raise ValueError("a server's name is 1 to 60 characters, without /")
        if (not command) == (not url):
            raise ValueError("give a command (stdio) or a URL (streamable HTTP), not both")
        spec = (
            {"command": command, "args": list(args), "env": dict(env or {})}
            if command
            else {"url": url}
        )
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM mcp_servers WHERE name = ?", (name,)).fetchone():
                raise ValueError(f"there is a server named {name!r} already")
            cur = conn.execute(
                "INSERT INTO mcp_servers (name, spec, created_at) VALUES (?, ?, ?)",
                (name, json.dumps(spec), time.time()),
            )
            return _record(cur.lastrowid, name, json.dumps(spec))

    def tool_servers(self) -> list[ToolServerRecord]:
        """Every server added, oldest first."""
        with self._read() as conn:
            rows = conn.execute("SELECT id, name, spec FROM mcp_servers ORDER BY id").fetchall()
        return [_record(r["id"], r["name"], r["spec"]) for r in rows]

    def delete_tool_server(self, server_id: int) -> None:
        with self._write() as conn:
            if conn.execute("DELETE FROM mcp_servers WHERE id = ?", (server_id,)).rowcount == 0:
                raise NotFoundError(f"no tool server with id {server_id}")


def _record(server_id: int, name: str, spec_json: str) -> ToolServerRecord:
    spec = json.loads(spec_json)
    return ToolServerRecord(
        server_id,
        name,
        spec.get("command"),
        tuple(spec.get("args", ())),
        dict(spec.get("env", {})),
        spec.get("url"),
    )
