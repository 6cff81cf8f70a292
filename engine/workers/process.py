"""What every worker process does first: name itself, tie its life to the main process, and
leave Ctrl+C to the main process (which stops the whole group in order)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1


def exit_when_parent_dies(main_pid: int) -> None:
    """End this process when the main process ``main_pid`` ends, however it ends."""
    # The kernel's parent-death signal covers SIGKILL on Linux where the parent is the fork
    # server, which exits as soon as the main process is gone. A worker spawned by the main
    # process itself is not given it: the kernel sends it when the *thread* that started the
    # worker ends (a start-up thread, long before the process). The polling thread covers those,
    # other systems and the race where the parent died before prctl ran.
    parent = os.getppid()
    if parent != main_pid:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def watch() -> None:
        while True:
            if os.getppid() != parent or gone(main_pid):
                os._exit(1)
            time.sleep(0.5)

    if gone(main_pid) or (parent == 1 and main_pid != 1):  # orphaned before this ran
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def init_worker(title: str, parent_pid: int, log_level: int) -> None:
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # exit at once: a worker keeps nothing worth saving, and interpreter clean-up (ZeroMQ's
    # context) could stall the group's shutdown past its few-second budget
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    exit_when_parent_dies(parent_pid)
    logging.basicConfig(level=log_level, format=f"%(asctime)s {title}: %(message)s", force=True)
