"""The scheduler core: continuous batching over the engine, with no transport code.

Each turn (:meth:`Scheduler.step`: the seed's ``normal_loop``, or ``overlap_loop`` on CUDA, picked
once) receives new requests and aborts, schedules one batch (a prefill batch while prompts can
start, else a decode batch of every running request), launches it, and turns sampled tokens into
:class:`TokenOutput` records. Every ending of a request, whatever its reason, goes through
:meth:`Scheduler.finish`, which returns the request's pages and forgets it.

Overlap scheduling (CUDA): a step launches batch N+1 *before* reading batch N's tokens, so the
CPU work of scheduling and preparing a step hides behind the GPU's work. Everything the next
schedule needs is known without the tokens (each sampling request grows by one token, held as a
placeholder until its value arrives); what is not known is whether a request just sampled its
EOS, so a finishing request may ride along in one extra step whose token is dropped.

The scheduler's parts, each with its own state: :class:`PrefillManager` (prefill.py: the waiting
queue, admission, prefill batches), :class:`DecodeManager` (decode.py: the running set),
:class:`KVMemory` (kv_memory.py: the pages of admitted requests, preemption, idle release) and
:class:`GrammarQueue` (grammar_queue.py: requests waiting for their grammar, token masks).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..engine import Engine, StepResult
from ..errors import RequestError, UserError, check_prompt_length
from ..kvcache import CacheManager, NaiveCacheManager, PageAllocator, RadixCacheManager
from ..logits_processor import TokenMasks
from ..messages import PromptProgressMsg, StatsMsg, prompt_work
from ..request import PLACEHOLDER, FinishReason, Req, TokenLogprobs
from ..sampling_params import SamplingParams
from .decode import DecodeManager
from .grammar_queue import GrammarQueue
from .kv_memory import KVMemory
from .prefill import PrefillManager, pages_for

logger = logging.getLogger(__name__)

EARLY_ABORTS_KEPT = 4096  # aborts that arrived before their request, remembered for a while
IDLE_RELEASE_S = 5.0
"""After this long with nothing to do, the memory of free KV pages goes back to the OS (a CPU
pool). Between the steps of a reply there is no pause near this long, so only a finished spell of
work pays: the next prompt writes its pages again, and a page the OS zero-fills on first touch
costs microseconds against a CPU prefill's milliseconds per token."""
IDLE_CACHE_EVICT_S = 600.0
"""After this long idle, the prefix cache's pages are freed and released too. Kept until then: a
person reads a reply and types the next turn within minutes, and finding the conversation cached
spares recomputing all of it (an 8,000-token chat is tens of seconds of CPU prefill); a chat left
alone for ten minutes gives its memory back to the rest of the machine."""
CACHE_MANAGERS: dict[str, type[CacheManager]] = {
    "radix": RadixCacheManager,
    "naive": NaiveCacheManager,
}
Receive = Callable[[bool], None]
"""How a loop takes in new requests and aborts: ``receive(blocking)``."""
ReportProgress = Callable[[list[PromptProgressMsg]], None]
"""Called as each prefill batch starts, with how far its long prompts have been read (maybe
none), and as a long prompt is read whole. The scheduler worker sends that and the stats on at
once, before the forward pass: a CPU chunk may take tens of seconds, and the request counts as
running from its first chunk on."""


def check_request(engine: Engine, token_ids: list[int], params: SamplingParams) -> None:
    """Raises :class:`RequestError` if the engine can never serve this request."""
    limit = engine.max_context_len
    capacity = engine.num_pages * engine.page_size
    check_prompt_length(len(token_ids), limit)
    if pages_for(len(token_ids) + 1, engine.page_size) > engine.num_pages:
        raise RequestError(
            f"the prompt has {len(token_ids)} tokens but the KV cache holds {capacity}; raise --max-kv-tokens"
        )
    vocab = engine.model_config.vocab_size
    if min(token_ids) < 0 or max(token_ids) >= vocab:
        raise RequestError(f"prompt token ids must be in [0, {vocab})")
    for name, ids in (
        ("logit_bias", params.logit_bias),
        ("stop_token_ids", params.stop_token_ids),
    ):
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"{name} token ids must be in [0, {vocab})")


@dataclass
class TokenOutput:
    """What one step produced for one request: a new token, an ending, or both."""

    uid: int
    token_id: int | None
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: TokenLogprobs | None = None  # when the request asked for them
    # with the first token of a request that asked for prompt logprobs: each prompt token and
    # its logprobs (None for the first, which nothing precedes)
    prompt_logprobs: list[tuple[int, TokenLogprobs | None]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class InFlight:
    """A launched step whose tokens have not been read yet."""

    result: StepResult
    sampled: list[tuple[Req, int]]  # (request, index in its token_ids awaiting the token)


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        max_running_requests: int | None = None,
        max_prefill_tokens: int | None = None,
        overlap: bool | None = None,
    ) -> None:
        """``overlap``: None = the config's choice on CUDA, never on CPU (nothing to hide)."""
        cfg = engine.config
        self.engine = engine
        self.in_flight: InFlight | None = None
        # one turn: normal_loop or overlap_loop
        self.step: Callable[[Receive | None], list[TokenOutput]]
        self.overlap = (
            (cfg.overlap and engine.device.type == "cuda") if overlap is None else overlap
        )
        self.page_size = engine.page_size
        self.max_running_requests = max_running_requests or cfg.max_running_requests
        if cfg.cache not in CACHE_MANAGERS:
            raise UserError(f"--cache {cfg.cache!r}: choose one of {', '.join(CACHE_MANAGERS)}")
        self.cache_manager = CACHE_MANAGERS[cfg.cache](
            PageAllocator(engine.num_pages), self.page_size
        )
        self.prefill_manager = PrefillManager(
            self.cache_manager,
            engine.page_table,
            self.page_size,
            max_prefill_tokens or engine.max_prefill_tokens,
            engine.first_prefill_chunk,
        )
        self.decode_manager = DecodeManager()
        self.kv_memory = KVMemory(
            engine, self.cache_manager, self.prefill_manager, self.decode_manager
        )
        self.reqs: dict[int, Req] = {}  # every live request by uid
        self.eos_token_ids = set(engine.eos_token_ids)
        self._early_aborts: OrderedDict[int, None] = OrderedDict()
        self._counters = dict(prompt=0, generation=0, finished=0, aborted=0)
        self.grammar_queue = GrammarQueue(engine)  # requests waiting for their grammar
        # endings decided outside a step (an abort, a bad grammar)
        self.ready_outputs: list[TokenOutput] = []
        self.report_progress: ReportProgress | None = None  # None: nobody listens (offline)

    # ---- requests in -------------------------------------------------------------------------

    def add_request(self, uid: int, token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raises :class:`RequestError` if it can never be served."""
        if self._early_aborts.pop(uid, "absent") is None:
            return  # its abort overtook it: drop it silently
        if uid in self.reqs:
            raise RequestError(f"request uid {uid} is already running")
        check_request(self.engine, token_ids, params)
        compiling = (
            self.grammar_queue.compile(params.grammar) if params.grammar is not None else None
        )
        limit = self.engine.max_context_len
        capacity = self.engine.num_pages * self.page_size
        # Clamp so the sequence fits both the context and (alone) the KV pool: finish "length".
        max_new = min(params.max_tokens, limit - len(token_ids), capacity - len(token_ids))
        generator = None
        if params.seed is not None and not params.is_greedy:
            generator = torch.Generator(device=self.engine.device).manual_seed(params.seed)
        # a cached prompt token has no logits to score it: such a request does not use the cache
        req = Req(
            uid=uid,
            token_ids=list(token_ids),
            prompt_len=len(token_ids),
            params=params,
            max_new_tokens=max_new,
            generator=generator,
            use_prefix_cache=params.prompt_logprobs is None,
        )
        self.reqs[uid] = req
        if compiling is not None:
            self.grammar_queue.add(req, compiling)
        else:
            self.prefill_manager.add(req)
        self._counters["prompt"] += len(token_ids)

    def _admit_compiled(self) -> None:
        """Requests whose grammar is compiled join the prefill queue; a bad grammar ends its
        request with the compiler's message, and so does one not compiled by its deadline
        (:meth:`GrammarQueue.take_compiled`). An aborted request's compile is cancelled if it
        has not begun (``finish``)."""
        if not self.grammar_queue.waiting:
            return
        idle = not self.reqs.keys() - self.grammar_queue.waiting.keys()
        ready, failed = self.grammar_queue.take_compiled(idle)
        for req, message in failed:
            self.ready_outputs.append(self.finish(req, FinishReason.ERROR, message))
        for req in ready:
            self.prefill_manager.add(req)

    def abort_request(
        self, uid: int, reason: FinishReason = FinishReason.ABORT
    ) -> TokenOutput | None:
        """End a request in any state (``reason`` STOP: the detokenizer found a stop string, a
        finish like EOS); an abort for an unknown uid is remembered in case the request is still
        on its way."""
        req = self.reqs.get(uid)
        if req is None:
            if reason == FinishReason.ABORT:
                self._early_aborts[uid] = None
                while len(self._early_aborts) > EARLY_ABORTS_KEPT:
                    self._early_aborts.popitem(last=False)
            return None
        return self.finish(req, reason)

    # ---- the one way out ---------------------------------------------------------------------

    def finish(self, req: Req, reason: FinishReason, error: str | None = None) -> TokenOutput:
        """End ``req``: give back its pages and table row, drop it from every queue."""
        req.finish_reason = reason
        # tokens still in flight are dropped, and so is the KV computed for them
        while req.token_ids and req.token_ids[-1] == PLACEHOLDER:
            req.token_ids.pop()
        req.cached_len = min(req.cached_len, len(req.token_ids))
        if req.table_slot >= 0:
            self.kv_memory.release(req)
        if req in self.prefill_manager.waiting:
            self.prefill_manager.remove(req)
        self.grammar_queue.cancel(req.uid)
        self.decode_manager.remove(req)
        self.reqs.pop(req.uid, None)
        self._counters["aborted" if reason == FinishReason.ABORT else "finished"] += 1
        return TokenOutput(req.uid, None, reason, error)

    # ---- one step ----------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self.reqs) or self.in_flight is not None or bool(self.ready_outputs)

    def release_idle_memory(self, evict_cache: bool) -> int:
        """While idle: give the memory of free KV pages (and, with ``evict_cache``, of the prefix
        cache's) back to the OS (:meth:`KVMemory.release_idle`). Returns the KV bytes released;
        0 with work in hand or a pool that keeps its memory (a GPU's)."""
        return 0 if self.has_work else self.kv_memory.release_idle(evict_cache)

    def schedule(self):
        self._admit_compiled()
        room = self.max_running_requests - len(self.decode_manager.running)
        batch = self.prefill_manager.schedule(max_new_requests=room)
        if batch is not None:
            return batch
        self.kv_memory.grow_decode_pages()
        return self.decode_manager.schedule()

    @property
    def overlap(self) -> bool:
        return self._overlap

    @overlap.setter
    def overlap(self, on: bool) -> None:
        """Picks the loop once (tests switch it between runs, never with a step in flight)."""
        assert self.in_flight is None, "switch the loop between runs"
        self._overlap = on
        self.step = self.overlap_loop if on else self.normal_loop

    def normal_loop(self, receive: Receive | None = None) -> list[TokenOutput]:
        """One turn of the seed's normal loop: receive → schedule → forward → process this
        batch's results. ``receive(blocking)`` takes in new requests and aborts (the scheduler
        worker's sockets; offline, nothing); it may block only when there is nothing to do."""
        if receive is not None:
            receive(not self.has_work)
        batch = self.schedule()
        launched = self.launch(batch) if batch is not None else None
        return self._take_ready() + (self.collect(launched) if launched is not None else [])

    def overlap_loop(self, receive: Receive | None = None) -> list[TokenOutput]:
        """One turn of the seed's overlap loop: receive → schedule → forward (queued on the GPU)
        → process the *previous* batch's results while the GPU computes this one."""
        if receive is not None:
            receive(not self.has_work)
        batch = self.schedule()
        last = self.in_flight  # still the previous step while this one launches (grammars read it)
        self.in_flight = self.launch(batch) if batch is not None else None
        return self._take_ready() + (self.collect(last) if last is not None else [])

    def _take_ready(self) -> list[TokenOutput]:
        """Endings decided outside a step: aborts, refused requests, grammars that failed."""
        ready, self.ready_outputs = self.ready_outputs, []
        return ready

    def drain(self) -> list[TokenOutput]:
        """Read the step still in flight (overlap), if any."""
        step, self.in_flight = self.in_flight, None
        return self.collect(step) if step is not None else []

    def launch(self, batch) -> InFlight:
        """Queue ``batch`` on the engine and advance every request as if its token were known."""
        token_masks = (
            partial(self._fill_token_masks, batch)
            if any(r.grammar is not None for r in batch.reqs)
            else None
        )
        if batch.phase == "prefill" and self.report_progress is not None:
            self.report_progress(self._chunks_starting(batch))
        result = self.engine.forward_batch(batch, token_masks)
        sampled = []
        read: list[PromptProgressMsg] = []  # prompts read in several chunks, now whole
        for i, (req, extend) in enumerate(zip(batch.reqs, batch.extend_lens)):
            samples = batch.samples(i)
            req.cached_len += extend
            if not samples:
                continue
            req.token_ids.append(PLACEHOLDER)
            sampled.append((req, len(req.token_ids) - 1))
            if batch.phase == "prefill":
                self.decode_manager.add(req)
                if req.reports_progress:  # once: not again for a recompute after preemption
                    read.append(self._progress(req, req.prompt_len))
                    req.reports_progress = False
        if read and self.report_progress is not None:
            self.report_progress(read)
        return InFlight(result, sampled)

    def _chunks_starting(self, batch) -> list[PromptProgressMsg]:
        """How far each prompt of a prefill batch that takes several chunks has been read, as
        its next chunk starts. A prompt is such once a chunk is cut from it (a prompt recomputed
        after preemption is not: its reply is already showing)."""
        progress = []
        for req, extend in zip(batch.reqs, batch.extend_lens):
            if req.output_len == 0 and (req.reports_progress or extend < req.extend_len):
                req.reports_progress = True
                progress.append(self._progress(req, req.cached_len))
        return progress

    def _progress(self, req: Req, done: int) -> PromptProgressMsg:
        """``done`` of ``req``'s prompt tokens read, in tokens and in reading cost."""
        per_position = self.engine.model_config.attention_cost_per_position
        return PromptProgressMsg(
            req.uid,
            done,
            req.prompt_len,
            prompt_work(done, per_position),
            prompt_work(req.prompt_len, per_position),
        )

    def _fill_token_masks(self, batch, sampling: list[int]) -> TokenMasks | None:
        """The grammar rows' bitmasks for ``batch`` (called by the engine once the forward pass
        is queued, so they are filled while the GPU computes)."""
        return self.grammar_queue.token_masks(
            batch, sampling, self.max_running_requests, self._read_in_flight_grammar_tokens
        )

    def _read_in_flight_grammar_tokens(self) -> None:
        """A grammar must have seen every earlier token: with overlap the previous step's tokens
        are read here (that step is done or about to be; the GPU is already busy with this one)."""
        if self.in_flight is not None:
            for (req, index), token in zip(self.in_flight.sampled, self.in_flight.result.tokens()):
                if req.grammar is not None and not req.finished:
                    req.token_ids[index] = token

    def collect(self, step: InFlight) -> list[TokenOutput]:
        """Read a launched step's tokens and end the requests they finish."""
        outputs: list[TokenOutput] = []
        tokens = step.result.tokens()
        for uid, entries in step.result.prompt_logprobs():  # before the first token they go with
            req = self.reqs.get(uid)
            if req is not None:
                req.prompt_logprobs.extend(entries)
        for (req, index), token, logprobs in zip(step.sampled, tokens, step.result.logprobs()):
            if req.finished:
                continue  # aborted, or finished by an earlier token, while this step ran
            req.token_ids[index] = token
            self._counters["generation"] += 1
            reason = self._finish_reason(req, token, index)
            out = self.finish(req, reason) if reason is not None else TokenOutput(req.uid, None)
            out.token_id, out.logprobs = token, logprobs
            if index == req.prompt_len and req.params.prompt_logprobs is not None:
                prompt = req.token_ids[: req.prompt_len]
                out.prompt_logprobs = list(zip(prompt, [None, *req.prompt_logprobs]))
                req.prompt_logprobs = []
            outputs.append(out)
        return outputs

    def _finish_reason(self, req: Req, token: int, index: int) -> FinishReason | None:
        """Why the token at ``token_ids[index]`` ends ``req``, if it does."""
        if token in req.params.stop_token_ids or (
            token in self.eos_token_ids and not req.params.ignore_eos
        ):
            return FinishReason.STOP
        if (
            req.grammar is not None
            and self.grammar_queue.is_stop(token)
            and not req.params.ignore_eos
        ):
            return FinishReason.STOP  # the grammar's end
        if index + 1 - req.prompt_len >= req.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def stats(self, replica: int = 0) -> StatsMsg:
        """Load and totals, as the front end's /metrics shows them (StatsMsg declares each)."""
        c, kv = self._counters, self.cache_manager.stats()
        queued = self.prefill_manager.waiting
        # Running: admitted, reading its prompt (a CPU prefill may take minutes) or generating.
        # Waiting: not admitted yet (for its pages, a free row, its grammar).
        waiting = sum(1 for req in queued if req.table_slot < 0) + len(self.grammar_queue.waiting)
        return StatsMsg(
            running=len(self.reqs) - waiting,
            waiting=waiting,
            kv_pages_total=kv.total,
            kv_pages_used=kv.used,
            kv_pages_cached=kv.cached,
            kv_pages_free=kv.free,
            prompt_tokens_total=c["prompt"],
            generation_tokens_total=c["generation"],
            requests_finished_total=c["finished"],
            requests_aborted_total=c["aborted"],
            prefix_cache_hit_tokens_total=self.prefill_manager.prefix_hit_tokens,
            prompt_tokens_pending=sum(req.extend_len for req in queued),
            replica=replica,
        )
