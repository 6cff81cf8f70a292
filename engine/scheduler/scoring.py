"""Teacher forcing, for comparing the model with a reference: the scheduler's requests fed the
true next token at every step instead of a sampled one (``LLM.score_batch``)."""

from __future__ import annotations

import torch

from ..request import FinishReason
from ..sampling_params import SamplingParams
from .scheduler import Scheduler


def score_batch(
    scheduler: Scheduler, requests: list[tuple[int, list[int], int]]
) -> list[torch.Tensor]:
    """Each ``(uid, tokens, prefill_len)`` prefills its first ``prefill_len`` tokens (chunked by
    the budget), then decodes with every step fed the next true token instead of a sampled one,
    all requests as one batch (so decode runs the batched kernels and CUDA graphs). Returns the
    float32 logits of every position [len(tokens), vocab] of each request, in order."""
    assert not scheduler.has_work, "score_batch() needs an otherwise idle scheduler"
    reqs, targets = [], {}
    for uid, tokens, prefill_len in requests:
        scheduler.add_request(
            uid,
            tokens[:prefill_len],
            SamplingParams(max_tokens=len(tokens) + 1, ignore_eos=True),
        )
        req = scheduler.reqs[uid]
        req.use_prefix_cache = False  # a cached prefix would leave its rows out
        reqs.append(req)
        targets[uid] = tokens
    rows: dict[int, list[torch.Tensor]] = {req.uid: [] for req in reqs}
    try:
        while any(not req.finished for req in reqs):
            batch = scheduler.schedule()
            assert batch is not None and set(batch.reqs) <= set(reqs), (
                "score_batch() needs an otherwise idle scheduler"
            )
            batch.all_logits = True
            logits = scheduler.engine.forward_logits(batch)
            for req, extend, part in zip(
                batch.reqs, batch.extend_lens, logits.split(batch.extend_lens)
            ):
                rows[req.uid].append(part)
                req.cached_len += extend
                tokens = targets[req.uid]
                if req.cached_len < req.seq_len:
                    continue  # a prefill chunk; the rest of the prompt follows
                if req.seq_len == len(tokens):
                    scheduler.finish(req, FinishReason.LENGTH)
                    continue
                req.token_ids.append(tokens[req.seq_len])  # the true next token, not a sample
                if batch.phase == "prefill":
                    scheduler.decode_manager.add(req)
    finally:
        for req in reqs:
            if not req.finished:
                scheduler.finish(req, FinishReason.ABORT)
    return [torch.cat(rows[req.uid]) for req in reqs]
