"""The engine's public surface (minisgl_engine/__init__.py) is all the chat app uses: every import
of the engine under app/ names ``minisgl_engine`` itself and only names it exports, and each
exported name resolves without loading more than its own module needs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import minisgl_engine

APP = Path(__file__).resolve().parents[1] / "app"


def engine_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import of the engine in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "minisgl_engine":
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "minisgl_engine"]
    return found


def test_the_app_imports_only_the_engines_public_names():
    wrong = []
    for path in sorted(APP.glob("*.py")):
        for line, module, names in engine_imports(path):
            if module != "minisgl_engine" or not names or not set(names) <= set(minisgl_engine.__all__):
                wrong.append(f"{path.name}:{line}: {module} {names}")
    assert not wrong, "app/ must import the engine as `from minisgl_engine import NAME` (engine/__init__.py):\n" + "\n".join(wrong)


def test_the_check_sees_a_deep_import(tmp_path):
    """The check above can fail: a file importing an internal module is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from minisgl_engine.server.openai_protocol import ChatCompletionRequest\nimport minisgl_engine.llm\n")
    assert [(m, n) for _, m, n in engine_imports(bad)] == [("minisgl_engine.server.openai_protocol", ["ChatCompletionRequest"]),
                                                           ("minisgl_engine.llm", [])]


def test_every_public_name_resolves_and_the_light_ones_do_not_load_torch():
    for name in minisgl_engine.__all__:
        assert getattr(minisgl_engine, name) is not None, name
    code = ("import sys\nfrom minisgl_engine import UserError, GenerateRequest, UserReply, ServerConfig\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
