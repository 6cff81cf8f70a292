"""Write chats-v2.sqlite3 with the release that used schema version 2 (app/chat/store.py at commit
1b897c89), for tests/unit/test_store.py's migration test. Run from the repository root:

    .venv/bin/python tests/data/make_chats_v2.py

The old module comes from git, so the file is what that release wrote; a fake clock makes it
the same on every run. Keep it small: it is committed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

RELEASE = "1b897c8918dc5c3b85d8e106e8e377f2d1609907"
HERE = Path(__file__).parent
OUT = HERE / "chats-v2.sqlite3"


class FakeClock:
    """Stands in for the ``time`` module: one second per call, from 2025-11-24."""

    def __init__(self) -> None:
        self.now = 1_764_000_000.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


def load_old_store(folder: Path):
    source = subprocess.run(
        ["git", "show", f"{RELEASE}:app/chat/store.py"],
        check=True,
        capture_output=True,
        text=True,
        cwd=HERE,
    ).stdout
    path = folder / "old_store.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_store", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_store"] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    module.time = FakeClock()
    return module


def write(old, path: Path) -> None:
    with old.ConversationStore(path) as s:
        assert old.SCHEMA_VERSION == 2
        a = s.create(
            "Capitals", old.ChatSettings(system_prompt="Answer in one word.", temperature=0.2)
        )
        s.append(a.id, "user", "What is the capital of France?")
        s.append(
            a.id,
            "assistant",
            "Paris.",
            old.MessageStats(ttft_ms=12.5, tok_s=80.0, tokens=3, finish_reason="stop"),
        )
        s.append(a.id, "user", "And of Italy?")
        reply = s.append(a.id, "assistant", "")
        s.update_message(
            reply.id, "Rome", old.MessageStats(tokens=2, finish_reason="abort", stopped=True)
        )
        gone = s.create("gone")  # leaves a gap in the ids
        s.append(gone.id, "user", "forget me")
        s.delete(gone.id)
        b = s.create("Deux 🐈", old.ChatSettings(thinking=True, max_tokens=2048))
        for i, role in enumerate(["user", "assistant", "user", "assistant"]):
            s.append(b.id, role, f"message {i}")
        s.truncate_after(b.id, 1)  # regenerate as the v2 UI did: drop, then append again
        s.append(b.id, "user", "Bonjour, ça va ?")
        s.append(
            b.id, "assistant", "<think>hm</think>Très bien.", {"tokens": 5, "finish_reason": "stop"}
        )
        s.create("empty")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = load_old_store(Path(tmp))
        OUT.unlink(missing_ok=True)
        write(old, OUT)
    print(f"{OUT}: {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
