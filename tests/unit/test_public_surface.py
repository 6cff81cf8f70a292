"""The engine's public surface (minisgl_engine/__init__.py) is all the chat app uses: every import
of the engine under app/ names ``minisgl_engine`` itself and only names it exports, and each
exported name resolves without loading more than its own module needs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import minisgl_engine

APP = Path(__file__).resolve().parents[2] / "app"


def engine_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each import of the engine in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "minisgl_engine"
        ):
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, [])
                for a in node.names
                if a.name.split(".")[0] == "minisgl_engine"
            ]
    return found


def test_the_app_imports_only_the_engines_public_names():
    wrong = []
    for path in sorted(APP.rglob("*.py")):
        for line, module, names in engine_imports(path):
            if (
                module != "minisgl_engine"
                or not names
                or not set(names) <= set(minisgl_engine.__all__)
            ):
                wrong.append(f"{path.relative_to(APP)}:{line}: {module} {names}")
    assert not wrong, (
        "app/ must import the engine as `from minisgl_engine import NAME` (engine/__init__.py):\n"
        + "\n".join(wrong)
    )


def test_every_module_of_the_app_and_the_engine_imports():
    """Each module imports on its own, in a fresh interpreter: a broken import in a module that
    is only loaded by a worker (the fork server's preload) would otherwise show up as a slower
    start, not a failure."""
    code = (
        "import importlib, pkgutil, minisgl_app, minisgl_engine\n"
        "for package in (minisgl_engine, minisgl_app):\n"
        "    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(module.name)\n"
    )
    run_fresh(code)


def run_fresh(code: str) -> str:
    """``code`` in a fresh interpreter (nothing imported yet); its standard output."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_every_name_imported_inside_a_function_exists():
    """Imports inside functions run only when their path does (a bench, a GPU path): each
    relative ``from .module import name`` in the app and the engine names something its module
    defines."""
    import importlib

    missing = []
    for root, package in ((ENGINE, "minisgl_engine"), (APP, "minisgl_app")):
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            here = [package, *parts[:-1]]  # the package the file is in (its own, for __init__)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ImportFrom) or not node.level:
                    continue
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                try:
                    module = importlib.import_module(target)
                except ImportError:  # a GPU-only library (flashinfer) on this machine
                    continue
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{target}.{alias.name}")
                        except ImportError:
                            missing.append(
                                f"{path.relative_to(root.parent)}:{node.lineno}: {target}.{alias.name}"
                            )
    assert not missing, "\n".join(missing)


def test_the_check_sees_a_deep_import(tmp_path):
    """The check above can fail: a file importing an internal module is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from minisgl_engine.api.openai_protocol import ChatCompletionRequest\nimport minisgl_engine.llm\n"
    )
    assert [(m, n) for _, m, n in engine_imports(bad)] == [
        ("minisgl_engine.api.openai_protocol", ["ChatCompletionRequest"]),
        ("minisgl_engine.llm", []),
    ]


def test_every_public_name_resolves_and_the_light_ones_do_not_load_torch():
    for name in minisgl_engine.__all__:
        assert getattr(minisgl_engine, name) is not None, name
    code = (
        "import sys\nfrom minisgl_engine import UserError, GenerateRequest, UserReply, ServerConfig\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


# --- the engine's floors ---------------------------------------------------------------------

ENGINE = Path(__file__).resolve().parents[2] / "engine"
FLOORS = {  # a module imports only from its own floor and those below (0: everything else)
    "kvcache": 1,
    "attention": 2,
    "layers": 3,
    "models": 4,  # kernels: the floor of what calls them
    "model_loader": 5,
    "kernels.fused_ops": 5,
    "kernels.cuda_graph": 5,
    "engine": 5,
    "batch_layout": 5,
    "scheduler": 6,
    "llm": 7,
    "workers": 8,
    "api": 9,
    "benchmarks": 9,
    "": 10,  # "": the package's public surface
}


def floor_of(module: str) -> int:
    return FLOORS.get(module, FLOORS.get(module.split(".")[0], 0)) if module else FLOORS[""]


def engine_modules(root: Path = ENGINE) -> dict[str, Path]:
    """Dotted name inside the package ("" for its __init__) -> file."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path = ENGINE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (relative imports anywhere in the file, those
    inside functions and under TYPE_CHECKING included)."""
    modules = engine_modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = [p for p in package if p]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package[: len(package) - node.level + 1] + (
                node.module.split(".") if node.module else []
            )
            for alias in node.names:
                sub = ".".join(base + [alias.name])
                targets.add(sub if sub in modules else ".".join(base))
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def structure_problems(graph: dict[str, set[str]]) -> list[str]:
    """Imports up the floors, and import cycles (each named by one of its edges)."""
    problems = [
        f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if floor_of(b) > floor_of(a)
    ]
    state: dict[str, str] = {}

    def visit(
        node: str,
    ) -> None:  # depth-first: an edge back to a module on the path closes a cycle
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                problems.append(f"import cycle through {node} -> {target}")
            elif target not in state:
                visit(target)
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return problems


def test_the_engine_has_no_import_cycles_and_no_imports_up_the_floors():
    assert structure_problems(import_graph()) == []


def test_the_structure_check_sees_a_cycle_and_an_import_up(tmp_path):
    """The check above can fail: a made-up package with both faults."""
    (tmp_path / "kvcache").mkdir()
    (tmp_path / "kvcache" / "__init__.py").write_text("from ..scheduler import x\n")
    (tmp_path / "scheduler.py").write_text("from .kvcache import y\n")
    problems = structure_problems(import_graph(tmp_path))
    assert problems == [
        "kvcache (floor 1) imports scheduler (floor 6)",
        "import cycle through scheduler -> kvcache",
    ]


def test_the_fork_servers_preload_runs_no_torch_operation():
    """Schedulers are forked from a process that imported ``worker_preload``. A torch operation
    run there at import (a kernel probe, a constant table) starts OpenMP's thread team, and a
    forked scheduler's first parallel operation then never returns."""
    code = (
        "from torch.profiler import profile, ProfilerActivity\n"
        "with profile(activities=[ProfilerActivity.CPU]) as prof:\n"
        "    import minisgl_engine.workers.worker_preload\n"
        "print(sorted({event.key for event in prof.key_averages()}))\n"
    )
    assert run_fresh(code).strip().splitlines()[-1] == "[]"
