"""The page's pull (app/model_pull.py) without a browser: ModelPuller following a child process
that speaks the JSON-lines protocol of `minisgl-chat pull --json-progress` (small Python scripts
here; the real command against a fake hub runs in test_models_panel's browser test), and the
sentences the page shows."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import psutil
import pytest

from minisgl_app.model_pull import ModelPuller, PullError, PullProgress


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def child(script: str) -> list[str]:
    """A pull command that runs ``script`` (it gets --json-progress, --, the model as argv)."""
    return [sys.executable, "-c", textwrap.dedent(script)]


BARS = """
    import json, sys, time
    assert sys.argv[1:] == ["--json-progress", "--", "org/model"], sys.argv
    print("a warning that is not JSON", flush=True)
    print(json.dumps({"bar": 1, "desc": "Fetching 2 files", "n": 0, "total": 2, "unit": "it"}), flush=True)
    for n in (0, 5_000_000, 12_000_000):
        print(json.dumps({"bar": 2, "desc": "Reconstructing", "n": n, "total": 12_000_000, "unit": "B"}), flush=True)
        time.sleep(0.05)
    print(json.dumps({"done": "/cache/models--org--model/snapshots/abc"}), flush=True)
"""


async def until_over(puller: ModelPuller, timeout: float = 20) -> PullProgress:
    async def wait() -> None:
        while not puller.progress.over:
            await puller.wait_change(1)

    await asyncio.wait_for(wait(), timeout)
    return puller.progress


@pytest.mark.anyio
async def test_a_pull_is_followed_to_its_end_and_a_second_one_waits() -> None:
    puller = ModelPuller(child(BARS))
    seen: list[str] = []
    progress = await puller.start(" org/model ")
    with pytest.raises(PullError, match="org/model is being pulled"):
        await puller.start("other/model")
    while not progress.over:
        seen.append(progress.line())
        await puller.wait_change(1)
    assert progress.state == "done" and progress.folder == "/cache/models--org--model/snapshots/abc"
    assert progress.line() == "✅ Pulled **org/model**. Pick it in the list and press Switch."
    # the bytes bar is the one shown, in the page's words; the line that is not JSON is kept
    assert any("downloading: " in line and " of 12.0 MB (" in line for line in seen), seen
    assert progress.bars[2]["n"] == 12_000_000 and list(puller.output) == [
        "a warning that is not JSON"
    ]
    assert not puller.busy
    with pytest.raises(PullError, match="Type a Hugging Face id"):
        await puller.start("  ")


@pytest.mark.anyio
async def test_cancel_ends_the_child_at_once_and_a_new_pull_may_start() -> None:
    puller = ModelPuller(
        child("""
        import json, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # what the pull started (a download thread's process)
        print(json.dumps({"bar": 1, "desc": "x", "n": 1, "total": 100, "unit": "B"}), flush=True)
        time.sleep(60)
    """)
    )
    progress = await puller.start("org/slow")
    while progress.state != "running":
        await puller.wait_change(5)
    pid = puller.proc.pid
    group = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    assert await puller.cancel()
    assert progress.state == "cancelled" and "cancelled" in progress.line()
    await asyncio.sleep(0.2)
    assert not [
        p
        for p in group
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not await puller.cancel()  # nothing left to cancel
    puller.command = child(BARS)
    await puller.start("org/model")
    assert (await until_over(puller)).state == "done"


@pytest.mark.anyio
async def test_a_refused_model_and_a_crash_are_failures_with_a_sentence() -> None:
    puller = ModelPuller(
        child("""
        import json, sys
        print(json.dumps({"error": "model 'org/missing' was not found on the Hugging Face Hub"}), flush=True)
        sys.exit(2)
    """)
    )
    await puller.start("org/missing")
    progress = await until_over(puller)
    assert progress.state == "failed"
    assert (
        progress.line()
        == "⚠️ Pulling **org/missing** failed: model 'org/missing' was not found on the Hugging Face Hub"
    )
    puller.command = child("""
        print("Traceback (most recent call last): ...", flush=True)
        print("MemoryError", flush=True)
        raise SystemExit(1)
    """)
    await puller.start("org/big")
    progress = await until_over(puller)
    assert (
        progress.state == "failed" and progress.error == "the pull exited with code 1: MemoryError"
    ), progress.error


def test_progress_lines_say_what_is_happening() -> None:
    progress = PullProgress("Qwen/Qwen3-0.6B")
    assert progress.line().startswith("Pulling **Qwen/Qwen3-0.6B**… (looking it up)")
    progress.bars[1] = {"desc": "Fetching 3 files", "n": 1, "total": 3, "unit": "it"}
    assert "Fetching 3 files: 1 of 3 · " in progress.line()
    progress.bars[2] = {
        "desc": "Reconstructing (incomplete total...)",
        "n": 300_000_000,
        "total": 1_200_000_000,
        "unit": "B",
    }
    assert "downloading: 0.30 GB of 1.20 GB (25%) · " in progress.line()
    gguf = PullProgress("/models/tiny.Q4_0.gguf", state="running")
    gguf.bars[7] = {
        "desc": "Converting and de-quantizing GGUF tensors...",
        "n": 30,
        "total": 120,
        "unit": "it",
    }
    assert "Converting and de-quantizing GGUF tensors: 30 of 120 · " in gguf.line()


@pytest.mark.anyio
async def test_the_model_typed_is_passed_after_a_double_dash_never_as_an_option() -> None:
    """Issue 41, item 10: the Pull box's text went onto the pull's command line as it was, before
    --json-progress: "--json-progress" typed there was taken as the flag. It comes after "--", and
    the real command line reads it as the model."""
    from minisgl_app.cli import build_parser

    puller = ModelPuller(
        child("""
        import json, sys
        print(json.dumps({"error": repr(sys.argv[1:])}), flush=True)
        sys.exit(2)
    """)
    )
    await puller.start("--json-progress")
    progress = await until_over(puller)
    assert progress.error == repr(["--json-progress", "--", "--json-progress"]), progress.error
    args = build_parser().parse_args(["pull", "--json-progress", "--", "--json-progress"])
    assert (args.model, args.json_progress) == ("--json-progress", True)


def test_a_local_path_outside_home_and_the_model_caches_fails_with_one_sentence(
    tmp_path, monkeypatch, capsys
) -> None:
    """Issue 41, item 10: the pull's failures told a file, a folder without config.json and a
    missing path apart, for any path: an oracle of what exists on the machine. Outside the user's
    home and the Hugging Face cache every local path gets one sentence; inside, the reason."""
    import json

    import minisgl_engine
    from minisgl_app import model_pull

    monkeypatch.setattr(minisgl_engine, "exit_when_parent_dies", lambda pid: None)
    home, outside = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(model_pull, "disclosed_roots", lambda: [home.resolve()], raising=False)

    def said(model: str) -> str:
        assert model_pull.run_pull(model) == 2
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]

    for root in (outside, home):
        (root / "empty-folder").mkdir(parents=True)
        (root / "a-file.txt").write_text("x")
        (root / "bad.gguf").write_text("not a gguf")
    paths = ("a-file.txt", "empty-folder", "missing-folder", "missing.gguf", "bad.gguf")
    models = [str(outside / p) for p in paths] + [f"{outside}/../elsewhere/{p}" for p in paths]
    sentences = {said(m).replace(m, "PATH") for m in models}
    assert len(sentences) == 1, sentences  # the same for every path: nothing told apart
    assert sentences == {f"PATH: {model_pull.NOT_A_MODEL}"}, sentences
    inside = {p: said(str(home / p)) for p in paths[:3]}
    assert len(set(inside.values())) == 3 and model_pull.NOT_A_MODEL not in " ".join(
        inside.values()
    ), inside


@pytest.mark.anyio
async def test_a_path_that_names_nothing_fails_at_once_without_a_child(
    tmp_path, monkeypatch
) -> None:
    """The pull's own process took 7-10 s to start only to say that a typed path does not exist
    (a new user's tour): said at once now, in the same sentences as the child's."""
    from minisgl_app import model_pull

    monkeypatch.setattr(model_pull, "disclosed_roots", lambda: [tmp_path.resolve()])
    puller = ModelPuller(child("raise SystemExit('the child must not start')"))
    with pytest.raises(PullError, match="no such file or folder"):
        await puller.start(str(tmp_path / "missing.gguf"))
    with pytest.raises(PullError, match=model_pull.NOT_A_MODEL):
        await puller.start("/nowhere-at-all/model.gguf")  # outside: nothing told apart
    assert puller.proc is None and puller.progress is None
