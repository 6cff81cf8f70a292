"""``minisgl-TP{rank}-scheduler``: the engine-core scheduler behind a message loop.

Each turn: receive messages (block only when idle), schedule and launch one batch, send the new
tokens to the detokenizer, push stats to the front end when they changed (and before blocking).
On CUDA the scheduler overlaps: the tokens sent in a turn are those of the step launched in the
turn before, so receiving, sending and scheduling happen while the GPU computes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import zmq

from ..config import EngineConfig
from ..errors import UserError
from ..messages import AbortBackendMsg, BackendBatch, DetokenizerBatch, DetokenizeMsg, FrontendBatch, ReadyMsg, StartupMsg, StatsMsg, UserMsg
from ..scheduler.scheduler import Scheduler, TokenOutput
from .ipc import Receiver, Sender, SocketPaths, reporting_startup
from .process import init_worker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerWorkerArgs:
    config: EngineConfig
    paths: SocketPaths
    rank: int
    parent_pid: int
    log_level: int = logging.WARNING


class SchedulerWorker:
    def __init__(self, scheduler: Scheduler, receiver: Receiver, to_detokenizer: Sender, to_frontend: Sender) -> None:
        self.scheduler = scheduler
        self.receiver = receiver
        self.to_detokenizer = to_detokenizer
        self.to_frontend = to_frontend
        self.prompt_lens: dict[int, int] = {}  # uid -> prompt length, while live
        self.unsent_stops: dict[int, list[str]] = {}  # uid -> stop strings, until its first reply
        self.last_stats: StatsMsg | None = None

    def handle(self, batches: list[BackendBatch]) -> list[DetokenizeMsg]:
        replies = []
        for batch in batches:
            for msg in batch.msgs:
                if isinstance(msg, AbortBackendMsg):
                    out = self.scheduler.abort_request(msg.uid)
                    if out is not None:
                        replies.append(self.to_detokenize(out))
                    continue
                assert isinstance(msg, UserMsg)
                try:
                    self.scheduler.add_request(msg.uid, msg.input_ids, msg.params)
                    if msg.uid in self.scheduler.reqs:
                        self.prompt_lens[msg.uid] = len(msg.input_ids)
                        self.unsent_stops[msg.uid] = list(msg.params.stop)
                except UserError as exc:
                    replies.append(DetokenizeMsg(msg.uid, None, finished=True, finish_reason="error", error=str(exc), prompt_tokens=len(msg.input_ids)))
        return replies

    def to_detokenize(self, out: TokenOutput) -> DetokenizeMsg:
        prompt_len = self.prompt_lens.pop(out.uid, 0) if out.finished else self.prompt_lens.get(out.uid, 0)
        stop = self.unsent_stops.pop(out.uid, None)
        return DetokenizeMsg(
            out.uid,
            out.token_id,
            finished=out.finished,
            finish_reason=out.finish_reason.value if out.finish_reason else None,
            error=out.error,
            prompt_tokens=prompt_len,
            stop=stop,
        )

    def stats(self) -> StatsMsg:
        s = self.scheduler.stats()
        return StatsMsg(
            running=s.running,
            waiting=s.waiting,
            kv_pages_total=s.kv.total,
            kv_pages_used=s.kv.used,
            kv_pages_cached=s.kv.cached,
            kv_pages_free=s.kv.free,
            prompt_tokens_total=s.prompt_tokens_total,
            generation_tokens_total=s.generation_tokens_total,
            requests_finished_total=s.requests_finished_total,
            requests_aborted_total=s.requests_aborted_total,
            prefix_cache_hit_tokens_total=s.prefix_cache_hit_tokens_total,
        )

    def push_stats(self) -> None:
        stats = self.stats()
        if stats != self.last_stats:
            self.to_frontend.send(FrontendBatch([stats]))
            self.last_stats = stats

    def loop(self) -> None:
        while True:
            idle = not self.scheduler.has_work
            if idle:
                self.push_stats()  # the front end sees the final state before we block
            replies = self.handle(self.receiver.recv_all(block=idle))
            replies += [self.to_detokenize(out) for out in self.scheduler.step()]
            if replies:
                self.to_detokenizer.send(DetokenizerBatch(replies))
            self.push_stats()


def run_scheduler_worker(args: SchedulerWorkerArgs) -> None:
    name = f"minisgl-TP{args.rank}-scheduler"
    init_worker(name, args.parent_pid, args.log_level)
    ctx = zmq.Context()
    to_frontend = Sender(ctx, args.paths.frontend)
    with reporting_startup(name, to_frontend):
        from ..engine import Engine

        def on_phase(phase: str) -> None:
            to_frontend.send(FrontendBatch([StartupMsg(name, phase)]))

        engine = Engine(args.config, on_phase=on_phase)
        scheduler = Scheduler(engine)
        receiver = Receiver(ctx, args.paths.scheduler, BackendBatch)
    worker = SchedulerWorker(scheduler, receiver, Sender(ctx, args.paths.detokenizer), to_frontend)
    info = {
        "device": str(engine.device),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "kv_tokens": engine.num_pages * engine.page_size,
        "max_context_len": engine.max_context_len,
        "attention": engine.attn_name,
        "cuda_graphs": engine.uses_cuda_graphs,
        "overlap": scheduler.overlap,
    }
    to_frontend.send(FrontendBatch([ReadyMsg(name, info=info)]))
    worker.loop()
