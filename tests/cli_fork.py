"""``minisgl-chat ARGS`` run in a process of its own that is forked from one which has already
imported the CLI and what it loads (torch, transformers): each run has its own exit code, stdout
and stderr, as a fresh process does, without ~4 s of imports each time (test_cli's ~30 runs took
~110 s of CI's 25 minutes as fresh processes).

What a fork does not see is output printed while those modules import: test_cli runs a few
commands as plain fresh processes for that."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

# The forking process: imports once, then for each request (a JSON line on stdin) forks a child
# that runs the CLI's main() with stdout and stderr sent to files, and answers with its exit code.
RUNNER = r"""
import json, os, sys, traceback
import minisgl_app.cli, minisgl_engine, torch, transformers  # the imports every run would pay for
from minisgl_engine import llm, model_loader  # noqa: F401 (generate and bench load these)

for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if request["cwd"]:
                os.chdir(request["cwd"])
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            sys.argv = ["minisgl-chat", *request["argv"]]
            code = minisgl_app.cli.main(request["argv"])
        except SystemExit as exc:  # argparse's usage errors, as a fresh process would exit
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 0)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


@dataclass
class ForkedCLI:
    """Sends ``minisgl-chat`` runs to the forking process; ``run`` returns what subprocess.run
    would (a CompletedProcess with text stdout and stderr)."""

    proc: subprocess.Popen
    folder: Path
    runs: int = 0

    @classmethod
    def start(cls, folder: Path) -> ForkedCLI:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        return cls(proc, folder)

    def run(
        self, *args: str, cwd: Path | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        self.runs += 1
        out, err = self.folder / f"{self.runs}.out", self.folder / f"{self.runs}.err"
        request = {
            "argv": list(args),
            "cwd": str(cwd) if cwd else None,
            "stdout": str(out),
            "stderr": str(err),
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(
            target=lambda: answer.append(self.proc.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(timeout)
        if not answer or not answer[0]:
            self.close()
            raise TimeoutError(
                f"minisgl-chat {' '.join(args)} did not end within {timeout} s (or the forking process died)"
            )
        code = json.loads(answer[0])["returncode"]
        return subprocess.CompletedProcess(
            ["minisgl-chat", *args], code, out.read_text(), err.read_text()
        )

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
