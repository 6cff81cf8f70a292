"""ZeroMQ plumbing shared by every process: socket addresses in a private runtime folder,
and PUSH/PULL endpoints that send and receive one batch wrapper per message."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import zmq

from ..errors import UserError
from ..messages import FrontendBatch, ReadyMsg, decoder, encode

logger = logging.getLogger(__name__)


def make_runtime_dir() -> Path:
    """A new folder only this user can enter (0700), unique per instance, so two servers on two
    ports never share sockets and no other local user can connect to ours. IPC socket paths must
    stay short (about 100 bytes), hence $XDG_RUNTIME_DIR or /tmp rather than a deep cache path."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.path.isdir(base) or not os.access(base, os.W_OK):
        base = None
    path = Path(tempfile.mkdtemp(prefix="minisgl-", dir=base))
    os.chmod(path, 0o700)
    return path


def remove_runtime_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- worker names: process titles, and how workers are named in messages and errors

DETOKENIZER_NAME = "minisgl-detokenizer-0"


def tokenizer_name(index: int) -> str:
    return f"minisgl-tokenizer-{index}"


def scheduler_name(replica: int, rank: int, dp: int = 1, tp: int = 1) -> str:
    """minisgl-TP{rank}-scheduler, and with --dp minisgl-DP{replica}-scheduler
    (minisgl-DP{replica}-TP{rank}-scheduler when the replica has several ranks)."""
    if dp == 1:
        return f"minisgl-TP{rank}-scheduler"
    return (
        f"minisgl-DP{replica}-scheduler" if tp == 1 else f"minisgl-DP{replica}-TP{rank}-scheduler"
    )


@dataclass(frozen=True)
class SocketPaths:
    """Where each stage listens (the receiver binds, senders connect)."""

    runtime_dir: str
    num_tokenizers: int
    num_replicas: int = 1  # --dp: one scheduler (its rank 0) per replica

    def tokenizer(self, i: int) -> str:
        return f"ipc://{self.runtime_dir}/tokenizer-{i}"

    def scheduler(self, replica: int = 0) -> str:
        return f"ipc://{self.runtime_dir}/scheduler-{replica}"

    @property
    def detokenizer(self) -> str:
        return f"ipc://{self.runtime_dir}/detokenizer"

    @property
    def frontend(self) -> str:
        return f"ipc://{self.runtime_dir}/frontend"


class Sender:
    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        self.socket = ctx.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(addr)

    def send(self, batch) -> None:
        self.socket.send(encode(batch), copy=False)


class Receiver:
    """A bound PULL socket that decodes only ``batch_type``; anything else (garbage, a pickle,
    a message for another channel) is logged and dropped, and the worker keeps running."""

    def __init__(self, ctx: zmq.Context, addr: str, batch_type: type) -> None:
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(addr)
        self.decoder = decoder(batch_type)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)

    def decode(self, raw: bytes):
        try:
            return self.decoder.decode(raw)
        except Exception as exc:  # msgspec.DecodeError, or a field's own check (SamplingParams)
            logger.warning(
                "dropped an invalid message (%d bytes): %s",
                len(raw),
                str(exc).splitlines()[0] if str(exc) else exc,
            )
        return None

    def recv_all(self, block: bool, timeout_ms: int | None = None) -> list:
        """Every batch pending now; if ``block``, wait (up to ``timeout_ms``) for the first."""
        batches = []
        if block and not self.poller.poll(timeout_ms):
            return batches
        while True:
            try:
                raw = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return batches
            batch = self.decode(raw)
            if batch is not None:
                batches.append(batch)


@contextmanager
def reporting_startup(worker: str, to_frontend: Sender | None) -> Iterator[None]:
    """Run a worker's start-up; if it fails, tell the front end why (it names the worker in
    the app's exit message) and exit, instead of dying silently."""
    try:
        yield
    except UserError as exc:
        if to_frontend is None:  # a rank on another machine: its log is all there is
            logger.error("%s failed to start: %s", worker, exc)
        else:
            to_frontend.send(FrontendBatch([ReadyMsg(worker, error=str(exc))]))
        sys.exit(1)
    except Exception as exc:
        logger.exception("%s failed to start", worker)
        if to_frontend is not None:
            to_frontend.send(
                FrontendBatch([ReadyMsg(worker, error=f"{type(exc).__name__}: {exc}")])
            )
        sys.exit(1)
