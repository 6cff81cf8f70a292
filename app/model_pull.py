"""Pulling a model from the chat page: a Hugging Face hub id downloaded into the Hugging Face
cache, or a ``.gguf`` file converted once into ours, as ``minisgl-chat pull`` does.

The pull runs as a child process, ``minisgl-chat pull --json-progress -- MODEL`` (the model
after ``--``: a name starting with "-" is not an option), so that Cancel can
end it at any point (huggingface_hub resumes a cut download next time; a cut conversion leaves
nothing, see gguf_convert), the app's own process never holds a conversion's memory, and the engine
keeps serving throughout. The child draws its progress bars as JSON lines (``JsonLinesBar``); the
app reads them (``ModelPuller``) and the page shows the latest (``PullProgress.line``).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from .chat.view import markdown_literal, size_text

CANCEL_WAIT_S = 5.0  # after SIGTERM, before SIGKILL


# ---- in the child: progress as JSON lines


class JsonLinesBar(tqdm):
    """A tqdm bar that prints its state as one JSON line on stdout at each refresh (at most every
    0.5 s) instead of drawing itself: huggingface_hub's download bars and transformers' GGUF
    conversion bar take it as their tqdm class."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.pop("name", None)  # huggingface_hub's bar name, for its own bars only
        kwargs["mininterval"] = max(kwargs.get("mininterval") or 0.0, 0.5)
        kwargs["disable"] = False
        kwargs["file"] = io.StringIO()  # display() below prints instead
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None) -> bool:
        info = self.format_dict
        print(
            json.dumps(
                {
                    "bar": id(self),
                    "desc": self.desc or "",
                    "n": info["n"],
                    "total": info["total"],
                    "unit": info["unit"],
                }
            ),
            flush=True,
        )
        return True


# What the pull says of a local path outside the places models are kept (``disclosed_roots``),
# whatever went wrong: "is a file", "no config.json" and "does not exist" told apart which paths
# exist anywhere the app's user can read.
NOT_A_MODEL = "not a model folder or GGUF file this app can read"
PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")  # as the engine's resolve_model reads a path


def names_a_path(model: str) -> bool:
    """Whether the engine's resolve_model takes ``model`` as a local path (else a hub id)."""
    model = model.strip()
    return (
        model.lower().endswith(".gguf")
        or model.startswith(PATH_PREFIXES)
        or model in (".", "..")
        or Path(model).expanduser().exists()
    )


def disclosed_roots() -> list[Path]:
    """Where a pull's failure may say what it found: the user's home (their own files, and our
    model cache) and the Hugging Face cache."""
    roots = [Path.home()]
    try:
        from huggingface_hub import constants

        roots.append(Path(constants.HF_HUB_CACHE))
    except ImportError:
        pass
    return [Path(os.path.realpath(r)) for r in roots]


def pull_failure(model: str, exc: BaseException) -> str | None:
    """The sentence a failed pull of ``model`` says; None for an error to report as it is (a
    crash). A local path outside ``disclosed_roots`` gets NOT_A_MODEL for every failure."""
    from minisgl_engine import UserError

    if names_a_path(model):
        real = Path(os.path.realpath(Path(model.strip()).expanduser()))
        if not any(real.is_relative_to(root) for root in disclosed_roots()):
            return f"{model.strip()}: {NOT_A_MODEL}"
    return str(exc) if isinstance(exc, UserError) else None


def run_pull(model: str) -> int:
    """``minisgl-chat pull --json-progress -- MODEL``: the bars, then ``{"done": folder, "name":
    the models panel's name of it}`` or ``{"error": sentence}`` (exit code 2)."""
    from minisgl_engine import exit_when_parent_dies, local_models, resolve_model

    exit_when_parent_dies(os.getppid())  # the app went away: stop downloading for it
    try:
        folder = resolve_model(None if model == "demo" else model, bars=JsonLinesBar)
    except Exception as exc:
        said = pull_failure(model, exc)
        if said is None:
            raise
        print(json.dumps({"error": said}), flush=True)
        return 2
    name = next(
        (m.name for m in local_models() if Path(m.folder).resolve() == Path(folder).resolve()), None
    )
    print(json.dumps({"done": str(folder), "name": name}), flush=True)
    return 0


# ---- in the app: the child and what the page shows of it


@dataclass
class PullProgress:
    """One pull as the page shows it."""

    model: str
    state: str = "starting"  # starting → running → done | failed | cancelled
    bars: dict[int, dict] = field(
        default_factory=dict
    )  # the child's bars by id: desc, n, total, unit
    folder: str | None = None  # where the model is, once done
    name: str | None = None  # its name in the models panel, once done
    error: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def over(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    def shown_bar(self) -> dict | None:
        """The bar that says most: the largest download in bytes, else the latest bar."""
        in_bytes = [b for b in self.bars.values() if b.get("unit") == "B" and b.get("total")]
        if in_bytes:
            return max(in_bytes, key=lambda b: b["total"])
        return next(reversed(self.bars.values()), None)

    def line(self) -> str:
        """A sentence for the page (Markdown; the model's name and the reason shown as typed)."""
        name = f"**{markdown_literal(self.model)}**"
        if self.state == "done":
            return f"✅ Pulled {name}. Pick it in the list and press Switch."
        if self.state == "failed":
            return f"⚠️ Pulling {name} failed: {markdown_literal(self.error)}"
        if self.state == "cancelled":
            return f"Pull of {name} cancelled. (A download goes on where it stopped if you pull it again.)"
        bar = self.shown_bar()
        seconds = f" · {time.monotonic() - self.started:.0f} s"
        if bar is None:
            return f"Pulling {name}… (looking it up){seconds}"
        n, total, unit = bar["n"], bar.get("total"), bar.get("unit")
        if unit == "B":
            done = size_text(n) + (
                f" of {size_text(total)} ({100 * n / total:.0f}%)" if total else ""
            )
        else:
            done = (
                f"{n:,.0f}"
                + (f" of {total:,.0f}" if total else "")
                + (f" {unit}" if unit and unit != "it" else "")
            )
        what = "downloading" if unit == "B" else (bar.get("desc", "").rstrip(".: ") or "working")
        return f"Pulling {name}… {what}: {done}{seconds}"


class PullError(Exception):
    """A pull that cannot start (another is under way, a path that names nothing)."""


class ModelPuller:
    """At most one pull at a time for the whole app (every tab sees it); the pull goes on if the
    tab that started it closes, and ends with the app (the child exits when its parent does)."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command or [sys.executable, "-m", "minisgl_app.cli", "pull"]
        self.progress: PullProgress | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.changed = asyncio.Event()
        self.output: deque[str] = deque(
            maxlen=20
        )  # the child's lines that are not progress, for a failure

    @property
    def busy(self) -> bool:
        return self.progress is not None and not self.progress.over

    async def start(self, model: str) -> PullProgress:
        model = model.strip()
        if not model:
            raise PullError("Type a Hugging Face id (org/name) or the path of a .gguf file first.")
        if self.busy:
            raise PullError(
                f"{self.progress.model} is being pulled; wait for it or cancel it first."
            )
        if names_a_path(model) and not Path(model).expanduser().exists():
            # said at once: the pull's own process takes seconds to start only to say the same
            from minisgl_engine import UserError

            raise PullError(pull_failure(model, UserError(f"{model}: no such file or folder")))
        self.progress, self.output = PullProgress(model), deque(maxlen=20)
        # its own session: Ctrl+C in the terminal reaches the app, which ends the pull in order
        self.proc = await asyncio.create_subprocess_exec(
            *self.command,
            "--json-progress",
            "--",
            model,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        asyncio.get_running_loop().create_task(self._follow(self.proc, self.progress))
        self._notify()
        return self.progress

    async def _follow(self, proc: asyncio.subprocess.Process, progress: PullProgress) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                if line:
                    self.output.append(line)
                continue
            if "bar" in event:
                progress.bars[event["bar"]] = event
                progress.state = "running" if progress.state == "starting" else progress.state
            elif "done" in event:
                progress.folder, progress.name = event["done"], event.get("name")
            elif "error" in event:
                progress.error = str(event["error"])
            self._notify()
        code = await proc.wait()
        if progress.state != "cancelled":
            if code == 0 and progress.folder:
                progress.state = "done"
            else:
                progress.state = "failed"
                progress.error = progress.error or self._why(code)
        self._notify()

    def _why(self, code: int) -> str:
        last = self.output[-1] if self.output else ""
        return f"the pull exited with code {code}" + (f": {last}" if last else "")

    async def cancel(self) -> bool:
        """End the pull under way; False when there is none."""
        proc, progress = self.proc, self.progress
        if proc is None or progress is None or progress.over:
            return False
        progress.state = "cancelled"
        self._signal(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), CANCEL_WAIT_S)
        except asyncio.TimeoutError:
            self._signal(proc, signal.SIGKILL)
        self._notify()
        return True

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the child and anything it started
        except ProcessLookupError:
            pass

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_change(self, timeout: float) -> None:
        """Until the progress changes, or ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
