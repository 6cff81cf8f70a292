"""``minisgl-chat serve``: the headless server — the engine's workers plus one HTTP front end
(OpenAI-compatible routes, /health, /metrics) on one asyncio loop."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..config import EngineConfig, ModelConfig, check_parallel
from ..errors import UserError
from ..workers.ipc import SocketPaths, make_runtime_dir, remove_runtime_dir

if (
    TYPE_CHECKING
):  # the web stack (starlette) is imported only by what serves HTTP: not by `bench --tp`
    from .security import AccessPolicy

logger = logging.getLogger("minisgl.server")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 1919
    api_key: str | None = None
    num_tokenizers: int = 1
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides the bind address and loopback
    allowed_origins: tuple[str, ...] = ()  # web pages allowed to call the server (with CORS)
    served_model_names: tuple[
        str, ...
    ] = ()  # names a request's `model` may give, the first listed; () = the model's own
    trust_request_chat_template: bool = (
        False  # a chat request may bring its own chat template (code the tokenizer runs)
    )
    max_request_bytes: int = (
        8 * 1024 * 1024
    )  # the largest /v1 body read (request_limits.MAX_REQUEST_BYTES); larger: 413

    def access_policy(self) -> AccessPolicy:
        from .security import AccessPolicy

        return AccessPolicy.for_bind(self.host, self.allowed_hosts, self.allowed_origins)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_server_config(server: ServerConfig) -> None:
    if not is_loopback(server.host) and not server.api_key:
        raise UserError(
            f"refusing to listen on {server.host} without --api-key: anyone on the network could use the engine"
        )
    if server.max_request_bytes < 1:
        raise UserError("--max-request-bytes must be at least 1")
    if server.num_tokenizers < 1:
        raise UserError("--num-tokenizer must be at least 1")
    server.access_policy()  # a malformed --allowed-hosts / --allowed-origins is a one-line error


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """Bind before starting any worker, so a bad or busy port is a one-line error that says what
    to do, not a late crash."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535 (0 picks a free one), got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(bind_error_hint(host, port, exc)) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def bind_error_hint(host: str, port: int, exc: OSError) -> str:
    """Why a bind failed, and the flag to change."""
    where = f"cannot listen on {host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: unknown --host {host!r}; use an IP address (127.0.0.1 on this machine only) or a name it resolves"
    if exc.errno == errno.EADDRINUSE:
        return f"{where}: the port is in use; is another server running? pick another --port (0 picks a free one)"
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root); pick a --port of 1024 or more"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine; pick --host 127.0.0.1 or one of its own addresses"
    return f"{where} ({exc.strerror or exc}); check --host and --port"


def served_model_name(config: EngineConfig) -> str:
    """The name /v1/models lists: the hub id, the folder or file name, or the demo's name."""
    from pathlib import Path

    from ..weights.demo import DEMO_MODEL_NAME

    model = config.model
    if config.dummy_weights and config.config:
        return config.config
    if model is None or model.strip() in ("", "demo"):
        return DEMO_MODEL_NAME
    if Path(model).expanduser().exists():
        return Path(model).name.removesuffix(".gguf")
    return model  # a hub id


def prepare_model(config: EngineConfig) -> tuple[EngineConfig, ModelConfig, str | None]:
    """Resolve (download / convert) the model once here, with progress in this terminal, so
    every worker gets a local folder. Returns the config, the model's shape and the tokenizer
    folder."""
    from ..hf_config import read_model_config

    model_dir = None
    if not (config.dummy_weights and config.config is not None):
        from ..weights.source import resolve_model

        model_dir = resolve_model(config.model)
        config = replace(config, model=str(model_dir))
    model_config = read_model_config(config, model_dir)
    if model_dir is not None:  # an AWQ/GPTQ variant we cannot hold: one line here, exit code 2
        from ..weights.int4_config import int4_checkpoint_format

        int4_checkpoint_format(model_dir)
    if config.tp * config.dp > 1:  # one rank fits any model's heads (and needs no torch here)
        from ..distributed import check_tp

        check_tp(model_config, config.tp, config.device, config.dp)
    tokenizer = config.tokenizer or (str(model_dir) if model_dir is not None else None)
    return config, model_config, tokenizer


def run_worker_node(config: EngineConfig) -> int:
    """A machine other than node 0: only its scheduler ranks (rank 0 on node 0 sends them the
    requests). Ends when any of them ends, or on SIGINT/SIGTERM."""
    import threading

    from ..workers.launcher import EngineProcesses

    try:
        config, model_config, _ = prepare_model(config)
    except UserError as exc:
        print(f"minisgl-chat: error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    result = {"code": 0}

    def on_exit(name: str, code: int | None) -> None:
        print(
            f"minisgl-chat: {name} exited (exit code {code}); shutting down this node",
            file=sys.stderr,
            flush=True,
        )
        result["code"] = 1
        done.set()

    procs = EngineProcesses(
        config,
        None,
        None,
        model_config.max_context_len,
        logging.getLogger("minisgl").getEffectiveLevel(),
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    procs.start(on_exit)
    print(
        f"minisgl-chat: node {config.node_rank} runs {', '.join(procs.names)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        while not done.wait(0.5):
            pass
    finally:
        procs.stop()
    return result["code"]


class Terminated(SystemExit):
    """SIGTERM: the ordinary way to stop a service. Raised (not the default handler's death)
    so that the clean-up runs; ``run_server`` then returns its own exit code, 0 when nothing
    failed: an orderly stop is a success (`make run` stopped with SIGTERM does not say Error)."""


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(128 + signum)


def run_server(
    config: EngineConfig,
    server: ServerConfig,
    mount: Callable[[object, object, object], None] | None = None,
    on_listen: Callable[[str], None] | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> int:
    """Run until SIGINT/SIGTERM or a worker's death; returns the exit code.

    The HTTP server answers at once (/health says 503 and the chat page shows progress) while
    the model is resolved, downloaded or converted, and the workers load it. ``mount(app,
    client, engine)`` lets the chat app add its UI to the same FastAPI app (one engine for both;
    ``engine``, an :class:`~.engine_host.EngineHost`, switches the model);
    ``on_listen(url)`` runs as soon as the address accepts connections, ``on_ready(url)`` once
    every worker is ready (after the "ready at" line).
    """
    check_server_config(server)
    check_parallel(config.tp, config.dp, config.nnodes, config.node_rank, config.dist_init_addr)
    if config.nnodes > 1:
        print(
            f"minisgl-chat: {config.tp} ranks on {config.nnodes} machines meet at {config.dist_init_addr}; that port is "
            "unauthenticated: use this on a trusted network only",
            file=sys.stderr,
            flush=True,
        )
    if config.node_rank > 0:
        return run_worker_node(config)
    return _ServerRun(config, server, mount, on_listen, on_ready).run()


class _ServerRun:
    """One run of ``serve`` on node 0: the listening socket, the workers' sockets folder, the
    HTTP server on one asyncio loop, and the engine behind it; ``exit_code`` is what it returns."""

    def __init__(
        self, config: EngineConfig, server: ServerConfig, mount, on_listen, on_ready=None
    ) -> None:
        self.config, self.server, self.mount, self.on_listen, self.on_ready = (
            config,
            server,
            mount,
            on_listen,
            on_ready,
        )
        self.listen_socket = bind_listen_socket(server.host, server.port)
        self.runtime_dir = make_runtime_dir()
        self.paths = SocketPaths(str(self.runtime_dir), server.num_tokenizers, config.dp)
        host = f"[{server.host}]" if ":" in server.host else server.host
        self.url = f"http://{host}:{self.listen_socket.getsockname()[1]}"  # --port 0: the port the system picked
        self.engine = None  # the EngineHost, made on the event loop, stopped after it
        self.app = None  # the FastAPI app (http_server)
        self.http = None  # the uvicorn server, made once the workers are starting
        self.exit_code = 0

    def run(self) -> int:
        # uvicorn catches SIGTERM, shuts down, then raises it again under the handler it found at
        # start-up; with the default one that kills this process before the `finally` below stops
        # the workers and removes the sockets folder. Raising SystemExit instead runs it.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            asyncio.run(self.serve())
        except Terminated:
            pass  # stopped in order: the exit code says whether anything failed before
        finally:
            if self.engine is not None:
                self.engine.stop()
            remove_runtime_dir(self.runtime_dir)
            self.listen_socket.close()
        return self.exit_code

    async def serve(self) -> None:
        import threading

        from ..workers.engine_host import EngineHost
        from ..workers.frontend import FrontendClient
        from ..workers.launcher import reporting_workers

        config, server = self.config, self.server
        self.loop = asyncio.get_running_loop()
        self.client = FrontendClient(
            self.paths,
            served_model_name(config),
            reporting_workers(server.num_tokenizers, config.dp, config.tp),
            config.dp_routing,
        )
        log_level = logging.getLogger("minisgl").getEffectiveLevel()
        self.engine = EngineHost(
            config, self.paths, self.client, log_level, self.fail, prepare_model
        )
        self.client.start()
        # The workers start first: they load the model while this process imports the web stack
        # (FastAPI, and Gradio for the chat page), seconds each on a small machine.
        threading.Thread(target=self.engine.start, name="engine-start", daemon=True).start()
        self.http = self.http_server()
        if self.exit_code:  # the engine failed while the web stack was imported
            self.http.should_exit = True
        announcer = asyncio.create_task(self.announce())
        if self.on_listen is not None:
            self.on_listen(
                self.url
            )  # the socket already listens: connections wait for the loop below
        try:
            await self.http.serve(sockets=[self.listen_socket])
        finally:
            announcer.cancel()
            self.client.close()

    def http_server(self):
        """The HTTP server: the OpenAI routes, and what ``mount`` adds (the chat page)."""
        import uvicorn

        from .openai_api import create_app

        server = self.server
        app = create_app(
            self.client,
            server.api_key,
            server.access_policy(),
            server.served_model_names,
            trust_request_chat_template=server.trust_request_chat_template,
            max_request_bytes=server.max_request_bytes,
        )
        if self.mount is not None:
            self.mount(app, self.client, self.engine)
        self.app = app
        http = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
        )
        self._uvicorn_handle_exit = http.handle_exit
        http.handle_exit = self.handle_exit
        return http

    def handle_exit(self, sig: int, frame: object) -> None:
        """SIGINT/SIGTERM: besides uvicorn's own stop, end the open streams at once with a
        reason, so that its graceful shutdown need not cancel them half-way; a mounted page ends
        its own (``app.state.exit_hooks``: its replies and its browser connections)."""
        self._uvicorn_handle_exit(sig, frame)
        self.loop.call_soon_threadsafe(self.client.fail_pending, "the server is shutting down")
        for hook in getattr(self.app.state, "exit_hooks", ()):
            self.loop.call_soon_threadsafe(hook)

    def fail(self, code: int, message: str) -> None:
        """The engine cannot go on (a worker died, the model failed to load): stop with ``code``
        (called from a watcher thread)."""
        print(f"minisgl-chat: error: {message}", file=sys.stderr, flush=True)
        self.exit_code = code
        if self.http is not None:  # else it is still being made, and stops once it is
            self.http.should_exit = True
        try:  # open requests end now, with the reason
            self.loop.call_soon_threadsafe(
                self.client.fail_pending, f"the engine stopped: {message}"
            )
        except RuntimeError:
            pass  # the loop is already closed

    async def announce(self) -> None:
        """One line once every worker is ready: where, what model, on what."""
        await self.client.ready_event.wait()
        info, config, names = (
            self.client.scheduler_info,
            self.config,
            self.server.served_model_names,
        )
        fast = f", {config.dp} replicas" if config.dp > 1 else ""
        if info.get("cuda_graphs"):
            fast += f", {info['cuda_graphs']} CUDA graphs captured in {info.get('graph_capture_s', 0):.1f} s"
        fast += ", overlap scheduling" if info.get("overlap") else ""
        served_as = f" as {', '.join(names)}" if names else ""
        print(
            f"minisgl-chat: ready at {self.url} (model {self.client.model_name}{served_as} on {info.get('device', '?')}, "
            f"KV cache {info.get('kv_tokens', '?')} tokens, attention {info.get('attention', '?')}{fast})",
            file=sys.stderr,
            flush=True,
        )
        if self.on_ready is not None:
            self.on_ready(self.url)
