"""``minisgl-TP{rank}-scheduler``: the engine-core scheduler behind a message loop (with ``--dp N``,
``minisgl-DP{replica}-scheduler``, or ``minisgl-DP{replica}-TP{rank}-scheduler`` when also --tp).

Each turn: receive messages (block only when idle), schedule and launch one batch, send the new
tokens to the detokenizer, push stats to the front end when they changed (and before blocking).
A prefill batch also pushes them as it starts, with the progress of the long prompts in it.
On CUDA the scheduler overlaps: the tokens sent in a turn are those of the step launched in the
turn before, so receiving, sending and scheduling happen while the GPU computes.

With tensor parallelism there is one such process per rank. Only rank 0 receives (from the
tokenizers) and sends (to the detokenizer and the front end); each turn it forwards what it
received to the other ranks as msgpack bytes, so every rank takes the same scheduling decisions
in the same order and the ranks' collective operations line up. While idle, rank 0 forwards an
empty turn every second, so the other ranks never wait long enough to time out.

With data parallelism each replica is such a group of its own (its own socket, its own
tensor-parallel group and GPUs); the replica's rank 0 tags its tokens and stats with the
replica's index.
"""

from __future__ import annotations

import logging
import signal

import msgspec
import torch
import zmq

from ..config import EngineConfig
from ..distributed import broadcast_bytes, get_tp, init_tp
from ..errors import UserError
from ..messages import (
    AbortBackendMsg,
    BackendBatch,
    DetokenizeMsg,
    DetokenizerBatch,
    FrontendBatch,
    PromptProgressMsg,
    ReadyMsg,
    StartupMsg,
    StatsMsg,
    UserMsg,
    decoder,
    encode,
)
from ..request import FinishReason
from ..scheduler.scheduler import IDLE_CACHE_EVICT_S, IDLE_RELEASE_S, Scheduler, TokenOutput
from .ipc import Receiver, Sender, reporting_startup, scheduler_name
from .process import init_worker
from .scheduler_args import SchedulerWorkerArgs

logger = logging.getLogger(__name__)


IDLE_HEARTBEAT_MS = 1000


class SchedulerWorker:
    """The scheduler behind its sockets. The rank's I/O is bound once: one process alone, rank 0
    of a tensor-parallel group (receives, forwards what it received to the other ranks, sends),
    or another rank (takes rank 0's messages, sends nothing)."""

    def __init__(
        self,
        scheduler: Scheduler,
        receiver: Receiver | None,
        to_detokenizer: Sender | None,
        to_frontend: Sender | None,
        replica: int = 0,
    ) -> None:
        """Ranks other than 0 have no sockets (None)."""
        self.scheduler = scheduler
        self.replica = replica
        self.tp = get_tp()
        self._backend_decoder = decoder(BackendBatch)
        self.receiver = receiver
        self.to_detokenizer = to_detokenizer
        self.to_frontend = to_frontend
        self.prompt_lens: dict[int, int] = {}  # uid -> prompt length, while live
        self.unsent_stops: dict[int, list[str]] = {}  # uid -> stop strings, until its first reply
        self.last_stats: StatsMsg | None = None
        if self.tp.size == 1:
            self.receive_msgs, self.send_results = self._receive_alone, self._send_results
            scheduler.report_progress = self.push_progress
        elif self.tp.rank == 0:
            self.receive_msgs, self.send_results = self._receive_and_forward, self._send_results
            scheduler.report_progress = self.push_progress
        else:
            self.receive_msgs, self.send_results = self._receive_forwarded, self._send_nothing

    def run_forever(self) -> None:
        while True:
            self.send_results(self.scheduler.step(self.receive))

    def receive(self, blocking: bool) -> None:
        """Take in this turn's messages (the same on every rank)."""
        for batch in self.receive_msgs(blocking):
            for msg in batch.msgs:
                self.process_msg(msg)

    def process_msg(self, msg: UserMsg | AbortBackendMsg) -> None:
        """A new request joins the scheduler; an abort (or a stop string's drop) ends one. What
        ends here leaves with the turn's results (``Scheduler.ready_outputs``)."""
        sched = self.scheduler
        if isinstance(msg, AbortBackendMsg):
            out = sched.abort_request(
                msg.uid, FinishReason.STOP if msg.stop else FinishReason.ABORT
            )
            if out is not None:
                sched.ready_outputs.append(out)
            return
        self.prompt_lens[msg.uid] = len(msg.input_ids)
        self.unsent_stops[msg.uid] = list(msg.params.stop)
        try:
            sched.add_request(msg.uid, msg.input_ids, msg.params)
        except UserError as exc:
            sched.ready_outputs.append(TokenOutput(msg.uid, None, FinishReason.ERROR, str(exc)))
            return
        if msg.uid not in sched.reqs:  # its abort came first: nothing will be sent for it
            self.prompt_lens.pop(msg.uid, None)
            self.unsent_stops.pop(msg.uid, None)

    # ---- the rank's I/O ------------------------------------------------------------------------

    def _receive_alone(self, blocking: bool) -> list[BackendBatch]:
        if not blocking:
            return self.receiver.recv_all(block=False)
        self.push_stats()  # the front end sees the final state before we block
        return self._wait_idle()

    def _wait_idle(self) -> list[BackendBatch]:
        """Block until messages come; a long enough wait gives KV memory back in two stages
        (free pages, then the prefix cache's: scheduler.IDLE_RELEASE_S, IDLE_CACHE_EVICT_S)."""
        if not self.scheduler.engine.kv_pool.releasable:
            return self.receiver.recv_all(block=True)
        waited_s = 0.0
        for after_s, evict_cache in ((IDLE_RELEASE_S, False), (IDLE_CACHE_EVICT_S, True)):
            batches = self.receiver.recv_all(
                block=True, timeout_ms=int((after_s - waited_s) * 1000)
            )
            if batches:
                return batches
            waited_s = after_s
            self.scheduler.release_idle_memory(evict_cache)
            self.push_stats()  # an eviction moved pages from cached to free
        return self.receiver.recv_all(block=True)

    def _receive_and_forward(self, blocking: bool) -> list[BackendBatch]:
        """Rank 0 of a group: while idle it forwards an empty turn every second, so the other
        ranks never wait long enough to time out."""
        if blocking:
            self.push_stats()
        batches = self.receiver.recv_all(block=blocking, timeout_ms=IDLE_HEARTBEAT_MS)
        msgs = [msg for batch in batches for msg in batch.msgs]
        broadcast_bytes(encode(BackendBatch(msgs)) if msgs else b"")
        return batches

    def _receive_forwarded(self, blocking: bool) -> list[BackendBatch]:
        data = broadcast_bytes(None)
        return [self._backend_decoder.decode(data)] if data else []

    def _send_results(self, outputs: list[TokenOutput]) -> None:
        if outputs:
            self.to_detokenizer.send(DetokenizerBatch([self.to_detokenize(out) for out in outputs]))
        self.push_stats()

    def _send_nothing(self, outputs: list[TokenOutput]) -> None:
        """Ranks other than 0: rank 0 sends the same results."""

    def to_detokenize(self, out: TokenOutput) -> DetokenizeMsg:
        prompt_len = (
            self.prompt_lens.pop(out.uid, 0) if out.finished else self.prompt_lens.get(out.uid, 0)
        )
        stop = self.unsent_stops.pop(out.uid, None)
        return DetokenizeMsg(
            out.uid,
            out.token_id,
            finished=out.finished,
            finish_reason=out.finish_reason.value if out.finish_reason else None,
            error=out.error,
            prompt_tokens=prompt_len,
            stop=stop,
            replica=self.replica,
            logprob=out.logprobs.logprob if out.logprobs is not None else None,
            top_logprobs=out.logprobs.top if out.logprobs is not None else None,
            prompt_logprobs=None
            if out.prompt_logprobs is None
            else [
                (token, None, []) if entry is None else (token, entry.logprob, entry.top)
                for token, entry in out.prompt_logprobs
            ],
        )

    def push_stats(self) -> None:
        self.push_progress([])

    def push_progress(self, progress: list[PromptProgressMsg]) -> None:
        """Long prompts' progress and the stats when they changed, in one message to the front end
        (``Scheduler.report_progress``: also as a prefill batch starts, so the status line counts
        a request as running while its first chunk is computed)."""
        msgs: list = list(progress)
        stats = self.scheduler.stats(self.replica)
        if stats != self.last_stats:
            msgs.append(stats)
            self.last_stats = stats
        if msgs:
            self.to_frontend.send(FrontendBatch(msgs))


def check_ranks_agree(engine, scheduler: Scheduler) -> None:
    """Every rank must serve the same model with the same settings (a rank started with other
    flags or files would take other decisions and deadlock the group)."""
    tp = get_tp()
    if tp.size == 1:
        return
    mine = {
        "model": engine.model_config.__dict__
        | {"rope_scaling": str(engine.model_config.rope_scaling)},
        "dtype": str(engine.dtype),
        "page_size": engine.page_size,
        "kv_pages": engine.num_pages,
        "max_running_requests": scheduler.max_running_requests,
        "max_prefill_tokens": scheduler.prefill_manager.max_prefill_tokens,
        "cache": engine.config.cache,
        "overlap": scheduler.overlap,
    }
    leader = msgspec.msgpack.decode(
        broadcast_bytes(msgspec.msgpack.encode(mine) if tp.rank == 0 else None)
    )
    for key, value in msgspec.msgpack.decode(msgspec.msgpack.encode(mine)).items():
        if leader.get(key) != value:
            raise UserError(
                f"tensor-parallel rank {tp.rank} disagrees with rank 0 on {key}: {value!r} vs {leader.get(key)!r}"
            )


def rank_device(config: EngineConfig, local_rank: int) -> str:
    """Rank i of a machine uses its GPU i (or the CPU); with --dp, ``local_rank`` counts the ranks
    of every replica on the machine (replica r's rank t is r * tp + t)."""
    if (config.tp == 1 and config.dp == 1) or config.device == "cpu":
        return config.device
    if config.device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{local_rank}"
    return config.device


def run_scheduler_worker(args: SchedulerWorkerArgs) -> None:
    name = scheduler_name(args.replica, args.rank, args.config.dp, args.config.tp)
    init_worker(name, args.parent_pid, args.log_level)
    # SIGTERM ends a rank at once, also while it waits inside a collective (where a Python
    # handler would not run until the call returns): it has nothing to save
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ctx = zmq.Context()
    to_frontend = Sender(ctx, args.paths.frontend) if args.paths is not None else None
    leader = args.rank == 0
    with reporting_startup(name, to_frontend):
        from dataclasses import replace

        from ..engine import Engine

        config = replace(args.config, device=rank_device(args.config, args.local_rank))
        if config.tp > 1:
            from ..model_loader import resolve_device

            init_tp(
                args.rank, config.tp, f"tcp://{args.dist_init_addr}", resolve_device(config.device)
            )

        def on_phase(phase: str) -> None:
            if leader and to_frontend is not None:
                to_frontend.send(FrontendBatch([StartupMsg(name, phase)]))

        engine = Engine(config, on_phase=on_phase)
        scheduler = Scheduler(engine)
        check_ranks_agree(engine, scheduler)
        receiver = (
            Receiver(ctx, args.paths.scheduler(args.replica), BackendBatch) if leader else None
        )
    if leader:
        worker = SchedulerWorker(
            scheduler, receiver, Sender(ctx, args.paths.detokenizer), to_frontend, args.replica
        )
        info = {
            "device": str(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."),
            "tp": config.tp,
            "replica": args.replica,
            "kv_tokens": engine.num_pages * engine.page_size,
            "max_context_len": engine.max_context_len,
            "attention": engine.attn_name,
            # how many decode graphs were captured and in how long (start-up time on a GPU)
            "cuda_graphs": len(engine.graph_runner.graphs) if engine.graph_runner else 0,
            "graph_capture_s": round(engine.graph_runner.capture_s, 1)
            if engine.graph_runner
            else 0.0,
            "overlap": scheduler.overlap,
        }
        to_frontend.send(FrontendBatch([ReadyMsg(name, info=info)]))
    else:
        worker = SchedulerWorker(scheduler, None, None, None)
    worker.run_forever()
