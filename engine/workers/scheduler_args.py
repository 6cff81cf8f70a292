"""What a scheduler worker is started with: apart from ``scheduler_worker`` (which imports torch)
so that the front end builds it without importing torch."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..config import EngineConfig
from .ipc import SocketPaths


@dataclass(frozen=True)
class SchedulerWorkerArgs:
    config: EngineConfig
    paths: SocketPaths | None  # None: a rank on a machine other than node 0
    rank: int
    parent_pid: int
    log_level: int = logging.WARNING
    dist_init_addr: str | None = None  # host:port of rank 0's rendezvous (tp > 1)
    local_rank: int = 0  # which GPU of this machine
    replica: int = 0  # --dp: which replica this rank belongs to
