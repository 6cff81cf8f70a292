"""docs/request-journey.md names code as `path/to/file.py:function` or `path/to/file.py:Class.method`.
Every such reference must point at something defined in that file (checked with ``ast``, so a name
that only appears in a comment, a string or as an attribute does not count). No server is started."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "request-journey.md"
MIN_REFERENCES = 25

# inline code spans: one or more backticks, the text, the same number of backticks
SPAN = re.compile(r"(`+)(.+?)\1")
# a path relative to the repository root, then a dotted name (Class.method, function.inner, ...)
REFERENCE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def references(markdown: str) -> list[tuple[str, str]]:
    """Every (path, dotted name) named in an inline code span outside fenced blocks, in order,
    without repeats."""
    found: list[tuple[str, str]] = []
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for span in SPAN.finditer(line):
            for ref in REFERENCE.finditer(span.group(2)):
                pair = (ref.group(1), ref.group(2))
                if pair not in found:
                    found.append(pair)
    return found


def _definitions(body: list[ast.stmt]):
    """Classes and functions (async ones too) defined directly in ``body``, also under a
    module-level ``if`` / ``try`` (e.g. ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.If):
            yield from _definitions(node.body)
            yield from _definitions(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _definitions(block)


def is_defined(tree: ast.Module, dotted: str) -> bool:
    """Whether ``dotted`` (``f``, ``Class``, ``Class.method``, ``outer.inner``) is defined."""
    body: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        node = next((n for n in _definitions(body) if n.name == part), None)
        if node is None:
            return False
        body = node.body
    return True


def missing_references(markdown: str, root: Path = ROOT) -> list[str]:
    """One line per reference that does not resolve (no such file, or no such definition)."""
    problems = []
    trees: dict[str, ast.Module | None] = {}
    for path, name in references(markdown):
        if path not in trees:
            file = root / path
            trees[path] = (
                ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
                if file.is_file()
                else None
            )
        tree = trees[path]
        if tree is None:
            problems.append(f"{path}:{name}: no file {path}")
        elif not is_defined(tree, name):
            problems.append(f"{path}:{name}: {name} is not defined in {path}")
    return problems


def test_the_doc_names_enough_code():
    refs = references(DOC.read_text(encoding="utf-8"))
    assert len(refs) >= MIN_REFERENCES, f"only {len(refs)} file:function references in {DOC.name}"


def test_every_reference_in_the_doc_exists():
    assert missing_references(DOC.read_text(encoding="utf-8")) == []


def test_the_checker_reports_made_up_references():
    doc = (
        "Real: `engine/engine.py:Engine.forward_batch`, `engine/workers/frontend.py:FrontendClient.listen` (async),\n"
        "`engine/api/openai_api.py:_v1_router.chat_completions` (a route inside a function).\n"
        "Made up: `engine/engine.py:no_such_function`, `engine/engine.py:Engine.no_such_method`,\n"
        "`engine/nowhere.py:run`, and `engine/engine.py:last_token` (only an attribute: the text has it, the defs do not).\n"
        "```python\n`engine/engine.py:inside_a_fence_is_not_a_reference`\n```\n"
    )
    assert [f"{p}:{n}" for p, n in references(doc)] == [
        "engine/engine.py:Engine.forward_batch",
        "engine/workers/frontend.py:FrontendClient.listen",
        "engine/api/openai_api.py:_v1_router.chat_completions",
        "engine/engine.py:no_such_function",
        "engine/engine.py:Engine.no_such_method",
        "engine/nowhere.py:run",
        "engine/engine.py:last_token",
    ]
    assert missing_references(doc) == [
        "engine/engine.py:no_such_function: no_such_function is not defined in engine/engine.py",
        "engine/engine.py:Engine.no_such_method: Engine.no_such_method is not defined in engine/engine.py",
        "engine/nowhere.py:run: no file engine/nowhere.py",
        "engine/engine.py:last_token: last_token is not defined in engine/engine.py",
    ]
