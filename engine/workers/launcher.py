"""Starts the worker processes, watches them, and stops them all together.

Workers are not forked from the main process (it runs an event loop and threads). Schedulers
come from a fork server: a fresh process that imported torch, transformers and the engine once
(``worker_preload``), so a scheduler (and a model switch's new one) starts without importing
them again; its socket sits in multiprocessing's private (0700) folder, removed at exit. The
tokenizers and the detokenizer import neither torch nor transformers (``LightTokenizer``): each
is spawned as a fresh interpreter that imports only its own module, so none of them maps
libtorch or shares the fork server's memory. The front end imports this module without torch.
Each worker reports ready (or its error) to the front end. If any worker dies, ``on_exit`` is
called so the whole group can go down; workers in turn exit when the main process dies.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from ..config import EngineConfig
from .detokenizer_worker import DetokenizerWorkerArgs, run_detokenizer_worker
from .ipc import DETOKENIZER_NAME, SocketPaths, scheduler_name, tokenizer_name
from .scheduler_args import SchedulerWorkerArgs
from .tokenizer_worker import TokenizerWorkerArgs, run_tokenizer_worker

logger = logging.getLogger("minisgl.launcher")


def free_port() -> int:
    """A free TCP port on the loopback interface (the ranks' rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reporting_workers(num_tokenizers: int, dp: int = 1, tp: int = 1) -> list[str]:
    """The workers that report ready to the front end: every tokenizer, the detokenizer, and
    each replica's rank 0 (for its whole tensor-parallel group)."""
    return (
        [tokenizer_name(i) for i in range(num_tokenizers)]
        + [DETOKENIZER_NAME]
        + [scheduler_name(replica, 0, dp, tp) for replica in range(dp)]
    )


def worker_context() -> mp.context.BaseContext:
    """Where schedulers come from: the fork server, preloaded (spawn where there is none)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["minisgl_engine.workers.worker_preload"]
    )  # read when the server starts (the first worker)
    return ctx


def light_context() -> mp.context.BaseContext:
    """Where the tokenizers and the detokenizer come from: a fresh interpreter each."""
    return mp.get_context("spawn")


def start_fork_server() -> None:
    """Start the schedulers' fork server now (it imports torch and the engine, seconds), so it is
    ready by the time the model is resolved and the first scheduler is asked of it."""
    if "forkserver" in mp.get_all_start_methods():
        from multiprocessing import forkserver

        worker_context()
        forkserver.ensure_running()


def run_scheduler(args: SchedulerWorkerArgs) -> None:
    """A scheduler worker's entry, importing its module (torch) in the worker only."""
    from .scheduler_worker import run_scheduler_worker

    run_scheduler_worker(args)


class EngineProcesses:
    def __init__(
        self,
        config: EngineConfig,
        paths: SocketPaths | None,
        tokenizer_path: str | None,
        max_context_len: int,
        log_level: int = logging.WARNING,
    ) -> None:
        """``paths`` None: a machine other than node 0, which runs only its scheduler ranks."""
        ctx, light = worker_context(), light_context()
        pid = os.getpid()
        self.processes: dict[str, BaseProcess] = {}
        if paths is not None:
            for i in range(paths.num_tokenizers):
                args = TokenizerWorkerArgs(
                    i, paths, tokenizer_path, max_context_len, pid, log_level
                )
                self.processes[tokenizer_name(i)] = light.Process(
                    target=run_tokenizer_worker, args=(args,), daemon=True
                )
            self.processes[DETOKENIZER_NAME] = light.Process(
                target=run_detokenizer_worker,
                args=(DetokenizerWorkerArgs(paths, tokenizer_path, pid, log_level),),
                daemon=True,
            )
        per_node = config.tp // config.nnodes
        for replica in range(
            config.dp
        ):  # --dp: replicas share nothing but the front end; one machine
            # each replica's ranks meet at a rendezvous of their own: every replica is its own group
            dist_init_addr = config.dist_init_addr or (
                f"127.0.0.1:{free_port()}" if config.tp > 1 else None
            )
            for local_rank in range(per_node):
                rank = config.node_rank * per_node + local_rank
                args = SchedulerWorkerArgs(
                    config,
                    paths,
                    rank,
                    pid,
                    log_level,
                    dist_init_addr=dist_init_addr,
                    local_rank=replica * per_node + local_rank,
                    replica=replica,
                )
                name = scheduler_name(replica, rank, config.dp, config.tp)
                self.processes[name] = ctx.Process(target=run_scheduler, args=(args,), daemon=True)
        self._stopping = threading.Event()

    @property
    def names(self) -> list[str]:
        return list(self.processes)

    def start(self, on_exit: Callable[[str, int | None], None]) -> None:
        for proc in self.processes.values():
            proc.start()
        threading.Thread(
            target=self._watch, args=(on_exit,), name="worker-watch", daemon=True
        ).start()

    def _watch(self, on_exit: Callable[[str, int | None], None]) -> None:
        by_sentinel = {proc.sentinel: name for name, proc in self.processes.items()}
        ready = wait(list(by_sentinel))
        if self._stopping.is_set():
            return
        name = by_sentinel[ready[0]]
        proc = self.processes[name]
        proc.join(0.1)
        on_exit(name, proc.exitcode)

    def stop(self, timeout: float = 1.0) -> None:
        """SIGTERM everyone, then SIGKILL whoever is still there after ``timeout``."""
        self._stopping.set()
        for proc in self.processes.values():
            if proc.is_alive():
                proc.terminate()
        # one deadline for all of them: workers keep no state worth a longer wait
        deadline = time.monotonic() + timeout
        for proc in self.processes.values():
            proc.join(max(deadline - time.monotonic(), 0.05))
        for name, proc in self.processes.items():
            if proc.is_alive():
                logger.info("%s did not exit on SIGTERM within %.1f s; killing it", name, timeout)
                proc.kill()
                proc.join(1)
