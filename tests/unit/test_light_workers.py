"""The tokenizer and detokenizer workers are small processes: started by the launcher as it
starts them for the server, they map no libtorch and import neither torch nor transformers, and
what they send on (prompt ids to the scheduler, text to the front end) is what transformers'
tokenizer gives.

This module imports neither torch nor transformers at its top: a spawned worker of the second
test imports it (to find its entry) and must stay light."""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

import pytest
import zmq

from minisgl_engine.config import EngineConfig
from minisgl_engine.messages import (
    BackendBatch,
    DetokenizeMsg,
    DetokenizerBatch,
    FrontendBatch,
    ReadyMsg,
    TokenizeMsg,
    TokenizerBatch,
    UserMsg,
    UserReply,
    decoder,
    encode,
)
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete
from minisgl_engine.workers.ipc import DETOKENIZER_NAME, SocketPaths, tokenizer_name

pytestmark = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)

HEAVY = ("torch", "transformers")
CHAT = [
    {"role": "system", "content": "You answer in one sentence."},
    {"role": "user", "content": "什么是 KV Cache？ 🚀"},
]


class Sockets:
    """The front end's and the scheduler's ends of the workers' sockets."""

    def __init__(self, paths: SocketPaths) -> None:
        self.ctx = zmq.Context()
        self.frontend = self._pull(paths.frontend)
        self.scheduler = self._pull(paths.scheduler(0))
        self.to_tokenizer = self._push(paths.tokenizer(0))
        self.to_detokenizer = self._push(paths.detokenizer)
        self.frontend_decoder = decoder(FrontendBatch)
        self.backend_decoder = decoder(BackendBatch)

    def _pull(self, addr: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(addr)
        return sock

    def _push(self, addr: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(addr)
        return sock

    def receive(self, sock: zmq.Socket, decode, timeout_s: float = 60.0) -> list:
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError("no message from the workers")
        return list(decode.decode(sock.recv()).msgs)

    def wait_ready(self, workers: set[str]) -> None:
        ready: set[str] = set()
        while not workers <= ready:
            for msg in self.receive(self.frontend, self.frontend_decoder):
                assert isinstance(msg, ReadyMsg) and msg.error is None, msg
                ready.add(msg.worker)

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@contextmanager
def light_workers(runtime_dir):
    """The launcher's tokenizer and detokenizer processes for the demo model, started (the
    scheduler it would start beside them is not), with the other ends of their sockets."""
    from minisgl_engine.workers.launcher import EngineProcesses

    paths = SocketPaths(str(runtime_dir), 1)
    procs = EngineProcesses(
        EngineConfig(model=str(demo_model_dir()), device="cpu"), paths, str(demo_model_dir()), 2048
    )
    light = [procs.processes[tokenizer_name(0)], procs.processes[DETOKENIZER_NAME]]
    sockets = Sockets(paths)
    try:
        for proc in light:
            proc.start()
        sockets.wait_ready({tokenizer_name(0), DETOKENIZER_NAME})
        yield light, sockets
    finally:
        for proc in light:
            proc.kill()
            proc.join(5)
        sockets.close()


def test_the_workers_map_no_torch_and_match_transformers(tmp_path):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(demo_model_dir())
    with light_workers(tmp_path) as (procs, sockets):
        for proc in procs:
            with open(f"/proc/{proc.pid}/maps") as maps:
                mapped = maps.read()
            assert "libtorch" not in mapped and "/torch/" not in mapped, proc.name
        # a chat through the tokenizer: the prompt ids the scheduler gets are transformers'
        params = SamplingParams(max_tokens=4)
        sockets.to_tokenizer.send(encode(TokenizerBatch([TokenizeMsg(1, params, messages=CHAT)])))
        (msg,) = sockets.receive(sockets.scheduler, sockets.backend_decoder)
        assert isinstance(msg, UserMsg)
        assert msg.input_ids == reference.apply_chat_template(
            CHAT, add_generation_prompt=True, return_dict=False
        )
        # tokens one at a time through the detokenizer: the streamed text is transformers' decode
        ids = reference.encode("Le cache KV 🚀 garde les clés et valeurs.")
        for i, token in enumerate(ids):
            last = i == len(ids) - 1
            msg = DetokenizeMsg(2, token, finished=last, finish_reason="length" if last else None)
            sockets.to_detokenizer.send(encode(DetokenizerBatch([msg])))
        text, finished = "", False
        while not finished:
            for reply in sockets.receive(sockets.frontend, sockets.frontend_decoder):
                assert isinstance(reply, UserReply)
                text += reply.incremental_output
                finished = reply.finished
        assert text == reference.decode(ids, skip_special_tokens=True)


def report_modules_then_run(entry, args, conn) -> None:
    """Run a worker's ``entry`` in this (spawned) process; a thread answers ``conn`` with the
    modules imported once asked (by then the worker has loaded its tokenizer and is serving)."""

    def answer() -> None:
        conn.recv()
        conn.send(sorted(sys.modules))

    threading.Thread(target=answer, daemon=True).start()
    entry(args)


@pytest.mark.parametrize("worker", ["tokenizer", "detokenizer"])
def test_the_workers_import_neither_torch_nor_transformers(tmp_path, worker):
    from minisgl_engine.workers.detokenizer_worker import (
        DetokenizerWorkerArgs,
        run_detokenizer_worker,
    )
    from minisgl_engine.workers.launcher import light_context
    from minisgl_engine.workers.tokenizer_worker import TokenizerWorkerArgs, run_tokenizer_worker

    paths = SocketPaths(str(tmp_path), 1)
    folder = str(demo_model_dir())
    if worker == "tokenizer":
        entry, args = run_tokenizer_worker, TokenizerWorkerArgs(0, paths, folder, 2048, os.getpid())
        name = tokenizer_name(0)
    else:
        entry, args = run_detokenizer_worker, DetokenizerWorkerArgs(paths, folder, os.getpid())
        name = DETOKENIZER_NAME
    ctx = light_context()
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=report_modules_then_run, args=(entry, args, theirs), daemon=True)
    sockets = Sockets(paths)
    try:
        proc.start()
        sockets.wait_ready({name})
        ours.send("modules?")
        assert ours.poll(30)
        modules = ours.recv()
    finally:
        proc.kill()
        proc.join(5)
        sockets.close()
    assert "tokenizers" in modules and "minisgl_engine.light_tokenizer" in modules
    imported = [m for m in modules if m.split(".")[0] in HEAVY]
    assert imported == [], imported[:10]
