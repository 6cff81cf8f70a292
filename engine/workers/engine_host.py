"""The engine's worker processes behind one front end, and the model they serve.

``start`` loads the start-up model in a thread (a failure there ends the server, as it always
did). ``switch`` serves another model without restarting the front end: what can be checked
before stopping the current model is checked first (the folder, config.json, the architecture,
the weight files' headers, the weights against this machine's memory on a CPU); then requests in
flight end with a reason, the workers (tokenizers, detokenizer, schedulers) stop, and new ones
start with the new model, reporting their start-up phases as at start. If the new model fails
to start (the scheduler's memory check, a bad tensor), the previous one is started again and
the switch raises ``UserError`` with the reason: the previous model keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..config import EngineConfig
from ..errors import UserError
from .frontend import FrontendClient, wait_first
from .ipc import SocketPaths
from .launcher import EngineProcesses, start_fork_server

logger = logging.getLogger("minisgl.server")

DRAIN_S = 0.2  # after the old workers stop: time for their last messages to reach the front end
# how long a worker's exit waits for its start-up error report: usually milliseconds, but on a
# loaded 2-core machine the front end's loop that reads it was seen more than 1 s late
ERROR_REPORT_WAIT_S = 5.0


@dataclass(frozen=True)
class PreparedModel:
    """A model resolved to a local folder and checked, ready for its workers to load."""

    name: str  # what /v1/models lists
    config: EngineConfig  # with ``model`` the local folder
    tokenizer_path: str | None
    max_context_len: int


class EngineHost:
    def __init__(
        self,
        config: EngineConfig,
        paths: SocketPaths,
        client: FrontendClient,
        log_level: int,
        fail: Callable[[int, str], None],
        prepare: Callable[[EngineConfig], tuple],
    ) -> None:
        """``fail(code, message)`` ends the server; ``prepare(config)`` is server.prepare_model."""
        self.config = config
        self.paths = paths
        self.client = client
        self.log_level = log_level
        self.fail = fail
        self.prepare = prepare
        self.procs: EngineProcesses | None = None
        self.serving: PreparedModel | None = None  # the model the workers run (or load)
        self.switching = False
        self.failure: str | None = None  # why the workers of a switch failed to start
        self.gave_up: asyncio.Event | None = (
            None  # set (on the loop) with ``failure``, or when stopping
        )
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop a switch runs on
        self.stopping = False
        self.lock = threading.Lock()

    # ---- start-up and shutdown

    def start(self) -> None:
        """The start-up model (call in a thread: it may download and convert it). The
        schedulers' fork server starts first: it imports torch while the model is resolved."""
        start_fork_server()
        try:
            self.client.phase = "preparing the model (the first run downloads and converts it)"
            prepared = self.prepare_model(self.config, self.client.model_name)
        except UserError as exc:
            self.fail(2, str(exc))
            return
        except Exception as exc:  # a bug: keep the traceback in the log
            logger.exception("model preparation failed")
            self.fail(1, f"model preparation failed: {type(exc).__name__}: {exc}")
            return
        self.client.use_model(prepared.name, prepared.tokenizer_path, prepared.max_context_len)
        self.client.phase = "loading the model"
        self.launch(prepared)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            procs, self.procs = self.procs, None
        self.give_up("the server is shutting down")
        if procs is not None:
            procs.stop()

    def prepare_model(self, config: EngineConfig, name: str) -> PreparedModel:
        engine_config, model_config, tokenizer_path = self.prepare(config)
        return PreparedModel(name, engine_config, tokenizer_path, model_config.max_context_len)

    def launch(self, prepared: PreparedModel) -> None:
        with self.lock:
            if self.stopping:
                return
            procs = EngineProcesses(
                prepared.config,
                self.paths,
                prepared.tokenizer_path,
                prepared.max_context_len,
                self.log_level,
            )
            procs.start(lambda name, code: self.on_exit(procs, name, code))
            self.procs, self.serving = procs, prepared
        logger.info("starting %d workers for %s ...", len(procs.names), prepared.name)

    def on_exit(self, procs: EngineProcesses, name: str, code: int | None) -> None:
        """A worker died (watcher thread). While a switch waits for its workers, that is the
        switch failing; otherwise the server goes down, naming it."""
        if procs is not self.procs:
            return  # a generation already stopped
        error = self.client.startup_errors.get(name)
        # still starting: its start-up error report may be on the way (once every worker is
        # ready none is sent, and a killed worker must end the app at once)
        if (
            error is None
            and not self.client.ready
            and self.client.error_reported.wait(ERROR_REPORT_WAIT_S)
        ):
            error = self.client.startup_errors.get(name)
        if self.switching and not self.client.ready:
            self.give_up(error or f"{name} exited (exit code {code})")
            return
        why = f"failed to start: {error}" if error else f"exited unexpectedly (exit code {code})"
        self.fail(1, f"{name} {why}; shutting down")

    # ---- switching

    async def check(self, model: str | None, name: str) -> PreparedModel:
        """Resolve and check ``model`` while the current one keeps serving; ``UserError`` says
        what is wrong with it."""
        config = replace(self.config, model=model, tokenizer=None, dummy_weights=False, config=None)
        try:
            prepared = await asyncio.to_thread(self.prepare_model, config, name)
            await asyncio.to_thread(check_weights, prepared)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 (whatever is wrong with the files: a sentence for the page)
            logger.exception("checking %s failed", name)
            raise UserError(f"{type(exc).__name__}: {exc}") from None
        return prepared

    async def switch(self, prepared: PreparedModel) -> None:
        """Serve ``prepared`` (from ``check``) instead of the current model. Returns once it is
        ready; raises ``UserError`` when it failed to start (the previous model is then started
        again, and serves once this returns)."""
        if self.switching:
            raise UserError("another model switch is under way; wait for it to finish")
        previous = self.serving
        if previous is None or not self.client.ready:
            raise UserError("the model is still loading; switch once the status line says Ready")
        self.switching = True
        try:
            await self.restart(prepared, f"the model is being switched to {prepared.name}")
            error = await self.wait_ready()
            if error is None:
                logger.info("now serving %s", prepared.name)
                return
            logger.error(
                "%s failed to start: %s; starting %s again", prepared.name, error, previous.name
            )
            await self.restart(previous, "")
            again = await self.wait_ready()
            if again is not None:
                self.fail(
                    1,
                    f"{previous.name} failed to start again after {prepared.name} failed: {again}",
                )
            raise UserError(f"{prepared.name} could not be loaded: {error}")
        finally:
            self.switching = False
            self.client.switching = False

    async def restart(self, prepared: PreparedModel, reason: str) -> None:
        """Stop the workers (requests in flight end with ``reason``) and start ``prepared``'s."""
        self.client.begin_switch(prepared.name, reason)
        with self.lock:
            procs, self.procs = self.procs, None
        if procs is not None:
            await asyncio.to_thread(procs.stop)
        await asyncio.sleep(DRAIN_S)
        self.failure, self.gave_up, self.loop = None, asyncio.Event(), asyncio.get_running_loop()
        self.client.use_model(prepared.name, prepared.tokenizer_path, prepared.max_context_len)
        self.client.phase = "loading the model"
        await asyncio.to_thread(self.launch, prepared)

    async def wait_ready(self) -> str | None:
        """None once every worker is ready; why not, once one failed or the server stops."""
        await wait_first(self.client.ready_event, self.gave_up)
        return None if self.client.ready else (self.failure or "the server is shutting down")

    def give_up(self, why: str) -> None:
        """A switch waiting for its workers stops waiting, with ``why`` (from any thread)."""
        if self.failure is None:
            self.failure = why
        gave_up, loop = self.gave_up, self.loop
        if gave_up is None or loop is None:
            return
        try:
            loop.call_soon_threadsafe(gave_up.set)
        except RuntimeError:
            pass  # the loop has closed: nobody waits


def check_weights(prepared: PreparedModel) -> None:
    """The weight files are there and their headers readable; on a CPU, the weights fit this
    machine's memory at all (the workers' own check against free memory comes when they load;
    a GPU is not touched from the front end's process)."""
    from pathlib import Path

    import psutil

    from ..model_loader import resolve_device
    from ..weights.safetensors_io import weights_nbytes

    folder = Path(prepared.config.model)
    device = resolve_device(prepared.config.device)
    dtype = None
    if device.type == "cpu":
        import torch

        dtype = (
            torch.float32
            if prepared.config.dtype == "auto"
            else getattr(torch, prepared.config.dtype, None)
        )
    # on CPU a GGUF's quantized blocks stay as they are
    needed = weights_nbytes(
        folder,
        dtype,
        keep_gguf_blocks=device.type == "cpu" and prepared.config.quantization == "auto",
    )
    if device.type == "cpu":
        total = psutil.virtual_memory().total
        if needed > total:
            gib = 1 << 30
            raise UserError(
                f"{prepared.name} needs {needed / gib:.1f} GiB of weights but this machine has "
                f"{total / gib:.1f} GiB of memory in all; pick a smaller model"
            )
