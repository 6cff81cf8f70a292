"""Structured output: grammars that constrain a request's text (JSON, a JSON schema, a regex, an
EBNF grammar), compiled and matched by xgrammar.

xgrammar is what SGLang uses: a compiled grammar precomputes, for each of its states, which
vocabulary tokens may come next, so filling a request's next-token bitmask costs tens of
microseconds, and the bitmask is applied to the logits on the device (a Triton kernel on CUDA).
Its compiler caches what it compiled, so the same schema is compiled once. (llguidance, the
other well-kept choice, computes masks lazily per step instead; xgrammar is what SGLang ships by
default, installs as one wheel, and its JSON-schema converter covers what OpenAI's strict mode
sends.)

The scheduler compiles a request's grammar on a worker thread (a large schema can take a while,
and the running requests keep decoding meanwhile); the request waits until it is ready, or ends
with the compiler's error (HTTP 400). Each request then has its own :class:`GrammarState`, which
accepts the request's tokens as they become known and fills its row of the bitmask.

A compile cannot be stopped once begun: xgrammar compiles in C++ without a way to interrupt it
from Python, so a request that is aborted, or gives up waiting (the scheduler's
``GRAMMAR_COMPILE_TIMEOUT_S``), leaves its compile running to the end (one queued behind it is
cancelled). What keeps every compile short is the bound on what may be compiled, checked in the
front end (``server/request_limits.py``: a 10,000-property schema kept two cores busy for 12
minutes); the compiler's cache is bounded too (``GRAMMAR_CACHE_BYTES``).
"""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .errors import RequestError
from .sampling_params import GrammarSpec
from .transfer import to_device

logger = logging.getLogger(__name__)

FILL_THREADS = 4  # threads that fill one step's bitmask rows
GRAMMAR_CACHE_BYTES = (
    256 * 1024 * 1024
)  # compiled grammars kept for reuse (xgrammar's default keeps all, without end)


def _readable(exc: Exception) -> str:
    """xgrammar's message without its C++ source location ("[12:00:00] /project/cpp/x.cc:12: ")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[\d:]+\]\s+\S+:\d+:\s*", "", text)


class GrammarCompiler:
    """Compiles :class:`GrammarSpec` s for one tokenizer, on a worker thread, with a cache."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar

        self.xgr = xgrammar
        # a grammar ends with one of the model's EOS tokens (the tokenizer's own when none of
        # the model's is in its vocabulary): the scheduler finishes a request on it
        stop = [t for t in stop_token_ids if 0 <= t < vocab_size]
        if not stop and tokenizer.eos_token_id is not None:
            stop = [tokenizer.eos_token_id]
        self.stop_token_ids = frozenset(stop)
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop
        )
        self.vocab_size = vocab_size
        self.compiler = xgrammar.GrammarCompiler(
            info, max_threads=2, cache_limit_bytes=GRAMMAR_CACHE_BYTES
        )
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self.batch_matcher = xgrammar.BatchGrammarMatcher(
            max_threads=FILL_THREADS
        )  # fills rows in parallel, in C++
        self.words = (vocab_size + 31) // 32
        self.buffers: list[
            torch.Tensor
        ] = []  # two bitmask buffers, used in turn (one may still be copying)
        self.turn = 0

    def submit(self, spec: GrammarSpec) -> Future:
        return self.pool.submit(self.compile, spec)

    def compile(self, spec: GrammarSpec):
        """The compiled grammar; a bad schema, regex or grammar raises :class:`RequestError`."""
        try:
            if spec.kind == "json_object":  # OpenAI's JSON mode: an object, not any JSON value
                return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "json_schema":
                try:
                    json.loads(spec.spec)
                except ValueError as exc:
                    raise RequestError(f"the JSON schema is not valid JSON: {exc}") from None
                # compact JSON: a small model given free whitespace may never stop emitting it
                return self.compiler.compile_json_schema(
                    spec.spec, any_whitespace=False, strict_mode=True
                )
            if spec.kind == "regex":
                return self.compiler.compile_regex(spec.spec)
            if spec.kind == "tool_call":
                return self.compiler.compile_grammar(self.tool_call_grammar(spec.spec))
            return self.compiler.compile_grammar(spec.spec)
        except RequestError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError with the reason
            raise RequestError(f"invalid {spec.kind.replace('_', ' ')}: {_readable(exc)}") from None

    def tool_call_grammar(self, spec: str):
        """One call of one of the tools, written in the model's convention (tool_calls.py):
        hermes ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``, llama3
        ``{"name": ..., "parameters": {...}}``; the arguments match the tool's JSON schema."""
        xgr = self.xgr
        info = json.loads(spec)
        hermes = info["format"] == "hermes"
        key = "arguments" if hermes else "parameters"
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": tool["name"]}, key: tool["parameters"]},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for tool in info["tools"]
        ]
        call = xgr.Grammar.from_json_schema(
            json.dumps({"anyOf": calls} if len(calls) > 1 else calls[0]), any_whitespace=False
        )
        if not hermes:
            return call
        return xgr.Grammar.concat(
            xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'),
            call,
            xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"'),
        )

    def fill_bitmask(self, states: list[GrammarState], rows: int, pinned: bool) -> torch.Tensor:
        """The next-token bitmask of each state, a [len(states), vocab/32] int32 tensor (one bit
        per token, set = allowed) in a reused buffer; ``rows`` bounds how many a step can have."""
        if not self.buffers or self.buffers[0].shape[0] < len(states):
            size = max(rows, len(states))
            self.buffers = [
                torch.empty(size, self.words, dtype=torch.int32, pin_memory=pinned)
                for _ in range(2)
            ]
        self.turn ^= 1
        bitmask = self.buffers[self.turn][: len(states)]
        bitmask.fill_(-1)
        self.batch_matcher.batch_fill_next_token_bitmask([s.matcher for s in states], bitmask)
        return bitmask

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set to -inf, in place, the logits of ``rows`` (bitmask row j for ``rows[j]``) that the
        bitmask forbids."""
        if logits.is_cuda:
            bitmask = bitmask.to(
                logits.device, non_blocking=True
            )  # from pinned memory: queued, not waited for
        if len(rows) == logits.shape[0]:
            self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
            return
        index = to_device(rows, logits.device)
        picked = logits[index]
        self.xgr.apply_token_bitmask_inplace(picked, bitmask, vocab_size=self.vocab_size)
        logits[index] = picked


@dataclass
class GrammarState:
    """One request's position in its grammar: it has accepted the first ``accepted`` generated
    tokens."""

    matcher: object  # xgrammar.GrammarMatcher
    accepted: int = 0
    broken: bool = field(default=False)  # a token the grammar refused (should not happen)

    def advance(self, new_tokens: list[int], uid: int) -> None:
        """Accept request ``uid``'s tokens generated since the last call
        (``Req.known_output_ids(since=self.accepted)``)."""
        for token in new_tokens:
            if not self.broken and not self.matcher.is_terminated():
                if not self.matcher.accept_token(token):
                    logger.warning(
                        "request %d: the grammar refused token %d; its output is no longer constrained",
                        uid,
                        token,
                    )
                    self.broken = True
            self.accepted += 1

    @property
    def active(self) -> bool:
        """Still constraining: once the grammar has ended (its stop token accepted) the request
        finishes with the token it has just sampled, and its row needs no mask."""
        return not self.broken and not self.matcher.is_terminated()
