"""Structured output in the scheduler: requests wait here while their grammar compiles on a
worker thread (the running requests keep decoding meanwhile), then join the prefill queue; each
step that samples a grammar's row gets that row's token bitmask (:mod:`..grammar`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait

from ..batch import Batch
from ..engine import Engine
from ..errors import RequestError
from ..grammar import GrammarCompiler, GrammarState
from ..logits_processor import TokenMasks
from ..request import Req
from ..sampling_params import GrammarSpec

logger = logging.getLogger(__name__)

GRAMMAR_WAIT_S = 0.005  # with nothing else to run, how long one step waits for a grammar to compile
GRAMMAR_COMPILE_TIMEOUT_S = 30.0
"""How long a request waits for its grammar (queued behind others' and compiled) before it fails.
The front end bounds what may be compiled (server/request_limits.py) so that none takes near
this long; the limit is the last guard, and the compile itself runs on (it cannot be stopped)."""


class GrammarQueue:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # made for the first structured request
        self.compiler: GrammarCompiler | None = None
        # uid -> request, its compiling grammar, its deadline
        self.waiting: dict[int, tuple[Req, Future, float]] = {}

    def compile(self, grammar: GrammarSpec) -> Future:
        """Start compiling a new request's grammar; raises :class:`RequestError` if structured
        output cannot run for this model."""
        return self._compiler().submit(grammar)

    def add(self, req: Req, compiling: Future) -> None:
        """``req`` waits for ``compiling`` (its grammar), until its deadline."""
        self.waiting[req.uid] = (req, compiling, time.monotonic() + GRAMMAR_COMPILE_TIMEOUT_S)

    def cancel(self, uid: int) -> None:
        """Stop waiting for a request's grammar (its compile is cancelled if not begun)."""
        waiting = self.waiting.pop(uid, None)
        if waiting is not None:
            waiting[1].cancel()

    def _compiler(self) -> GrammarCompiler:
        if self.compiler is None:
            from ..tokenizer import load_tokenizer

            path = self.engine.config.tokenizer or self.engine.model_dir
            tokenizer = load_tokenizer(path) if path is not None else None
            if tokenizer is None:
                raise RequestError(
                    "structured output needs the model's tokenizer, and this model has none"
                )
            try:
                self.compiler = GrammarCompiler(
                    tokenizer, self.engine.model_config.vocab_size, list(self.engine.eos_token_ids)
                )
            except ImportError:
                raise RequestError(
                    "structured output needs xgrammar: pip install xgrammar"
                ) from None
            except Exception as exc:  # this request fails; the engine keeps serving the others
                logger.exception("structured output could not start")
                raise RequestError(
                    f"structured output could not start for this model's tokenizer: {exc}"
                ) from None
        return self.compiler

    def take_compiled(self, idle: bool) -> tuple[list[Req], list[tuple[Req, str]]]:
        """The requests whose grammar is compiled (each now with its :class:`GrammarState`),
        and those that must end with an error: a bad grammar (the compiler's message), or one
        not compiled by its deadline (still waiting here: ending it cancels its compile). Never
        waits for a compile, except a moment when the scheduler is ``idle`` (nothing else to
        run), and with --tp, whose ranks must admit the same requests at the same step: there
        the front end's bounds on grammars are what keeps the wait short."""
        ready: list[Req] = []
        failed: list[tuple[Req, str]] = []
        if not self.waiting:
            return ready, failed
        compiling = [f for _, f, _ in self.waiting.values()]
        if self.engine.tp.size > 1:
            wait(compiling)  # tensor-parallel ranks must admit the same requests at the same step
        elif idle:  # nothing else to run: wait a little
            wait(compiling, timeout=GRAMMAR_WAIT_S, return_when=FIRST_COMPLETED)
        now = time.monotonic()
        for uid, (req, compiling, deadline) in list(self.waiting.items()):
            if not compiling.done():
                if now > deadline:
                    message = (
                        f"the grammar was not compiled within {GRAMMAR_COMPILE_TIMEOUT_S:g} s (GRAMMAR_COMPILE_TIMEOUT_S); "
                        "simplify the schema, regex or grammar"
                    )
                    failed.append((req, message))
                continue
            del self.waiting[uid]
            try:
                req.grammar = GrammarState(self.compiler.xgr.GrammarMatcher(compiling.result()))
            except Exception as exc:
                # a RequestError (bad schema) or anything xgrammar raised: this request only
                message = (
                    str(exc)
                    if isinstance(exc, RequestError)
                    else f"the grammar could not be used: {exc}"
                )
                failed.append((req, message))
                continue
            ready.append(req)
        return ready, failed

    def is_stop(self, token: int) -> bool:
        """Whether ``token`` ends a grammar (the tokenizer's EOS where the model names none)."""
        return token in self.compiler.stop_token_ids

    def token_masks(
        self, batch: Batch, sampling: list[int], max_rows: int, catch_up: Callable[[], None]
    ) -> TokenMasks | None:
        """The grammar rows' bitmasks for ``batch`` (``sampling``: the batch indexes of its
        sampling rows). A grammar must have seen every earlier token: ``catch_up`` reads the
        tokens still in flight (overlap) before any grammar advances."""
        rows = [
            row
            for row, i in enumerate(sampling)
            if batch.reqs[i].grammar is not None and batch.reqs[i].grammar.active
        ]
        if not rows:
            return None  # every grammar here has ended: nothing to wait for
        catch_up()
        states = []
        for row in rows:
            req = batch.reqs[sampling[row]]
            req.grammar.advance(req.known_output_ids(since=req.grammar.accepted), req.uid)
            states.append(req.grammar)
        active = [j for j, state in enumerate(states) if state.active]  # one may have just ended
        states, rows = [states[j] for j in active], [rows[j] for j in active]
        if not rows:
            return None
        bitmask = self.compiler.fill_bitmask(states, max_rows, self.engine.device.type == "cuda")
        return TokenMasks(bitmask, rows, self.compiler.apply_bitmask)
