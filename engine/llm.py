"""Offline generation: ``LLM(model).generate(prompts, sampling_params)`` drives the scheduler
in-process until every request has finished."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from .config import EngineConfig
from .engine import Engine
from .errors import UserError
from .request import FinishReason, TokenLogprobs
from .sampling_params import SamplingParams
from .scheduler.scheduler import Scheduler
from .scheduler.scoring import score_batch
from .tokenizer import chat_prompt_ids, load_tokenizer


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # per token, when params.logprobs
    # per prompt token, when params.prompt_logprobs is set (None for the first token)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)


class LLM:
    """An engine, a scheduler and (when the model has one) a tokenizer, in this process."""

    def __init__(
        self, model: str | None = None, *, config: EngineConfig | None = None, **engine_kwargs
    ) -> None:
        self.config = config if config is not None else EngineConfig(model=model, **engine_kwargs)
        self.engine = Engine(self.config)
        self.scheduler = Scheduler(self.engine)
        tokenizer_path = self.config.tokenizer or self.engine.model_dir
        self.tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
        self._uids = itertools.count()

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.tokenizer is None:
            raise UserError(
                "this model has no tokenizer (dummy weights): pass token ids or --tokenizer PATH"
            )
        if chat:
            return chat_prompt_ids(self.tokenizer, [{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def decode(self, token_ids: list[int]) -> str:
        return (
            self.tokenizer.decode(token_ids, skip_special_tokens=True)
            if self.tokenizer is not None
            else ""
        )

    def _submit(self, prompts, sampling_params, chat: bool) -> dict[int, GenerationResult]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params or SamplingParams()] * len(prompts)
        )
        if len(params_list) != len(prompts):
            raise UserError("give one SamplingParams per prompt, or one for all")
        results: dict[int, GenerationResult] = {}
        try:
            for prompt, params in zip(prompts, params_list):
                uid = next(self._uids)
                ids = self.encode(prompt, chat)
                self.scheduler.add_request(uid, ids, replace(params))
                results[uid] = GenerationResult(prompt_token_ids=ids)
        except Exception:
            for uid in results:  # all or nothing: withdraw the prompts already queued
                self.scheduler.abort_request(uid)
            raise
        return results

    def stream(
        self, prompts, sampling_params=None, chat: bool = False
    ) -> Iterator[tuple[int, int | None, str | None]]:
        """Yield ``(index, token_id, finish_reason)`` as the scheduler produces them."""
        results = self._submit(prompts, sampling_params, chat)
        index = {uid: i for i, uid in enumerate(results)}
        pending = set(results)
        try:
            while pending:
                for out in self.scheduler.step():
                    yield (
                        index[out.uid],
                        out.token_id,
                        out.finish_reason.value if out.finish_reason else None,
                    )
                    if out.finished:
                        pending.discard(out.uid)
        finally:
            for uid in pending:  # the caller stopped early: abort what is left
                self.scheduler.abort_request(uid)
            self.scheduler.drain()

    def score(self, token_ids: list[int], prefill_len: int | None = None):
        """Teacher-forced logits [len(token_ids), vocab]: the first ``prefill_len`` tokens go
        through prefill (chunked by the budget), each later one through its own decode step.
        Used to compare our model with a reference implementation."""
        return self.score_batch([token_ids], None if prefill_len is None else [prefill_len])[0]

    def score_batch(self, sequences: list[list[int]], prefill_lens: list[int] | None = None):
        """``score`` for many sequences at once, decoded as one batch (the scheduler's
        teacher forcing, :func:`scheduler.scoring.score_batch`). Returns one logits tensor per
        sequence."""
        prefill_lens = [len(s) for s in sequences] if prefill_lens is None else prefill_lens
        return score_batch(
            self.scheduler,
            [(next(self._uids), tokens, n) for tokens, n in zip(sequences, prefill_lens)],
        )

    def generate(self, prompts, sampling_params=None, chat: bool = False) -> list[GenerationResult]:
        results = self._submit(prompts, sampling_params, chat)
        ordered = list(results.values())
        while any(r.finish_reason is None for r in ordered):
            for out in self.scheduler.step():
                res = results[out.uid]
                if out.token_id is not None:
                    res.token_ids.append(out.token_id)
                if out.logprobs is not None:
                    res.logprobs.append(out.logprobs)
                if out.prompt_logprobs is not None:
                    res.prompt_logprobs = [entry for _, entry in out.prompt_logprobs]
                if out.finished:
                    res.finish_reason = out.finish_reason.value
        self.scheduler.drain()  # a finished request's extra step may still be in flight
        for res in ordered:
            res.text = self.decode(res.token_ids)
        return ordered


__all__ = ["LLM", "GenerationResult", "SamplingParams", "FinishReason"]
