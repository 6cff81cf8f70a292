"""Per-request edits to a batch's logits between the model and the sampler, and the
log-probabilities some requests ask for.

One batch mixes requests that ask for nothing (most of them) with requests that have penalties,
a logit bias, ``min_tokens``, ``min_p``, a grammar or logprobs. Each edit gathers only the rows
that need it, edits them in one batched op and scatters them back, so a batch of plain requests
costs nothing extra. Nothing here waits for the GPU.

Penalties need the counts of the tokens each request has seen: they live on the device in one
``[max_running_requests, vocab]`` table indexed by page-table row (allocated the first time a
request uses a penalty), are set from the request's tokens when it is admitted to a row, and grow
by the sampled token after each step, on the device, so the scheduler never has to wait for a
token to count it (overlap scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .request import PLACEHOLDER, Req
from .transfer import to_device


@dataclass
class TokenMasks:
    """Grammar bitmasks for one step: ``bitmask[j]`` applies to sampling row ``rows[j]``
    (filled by the scheduler's grammar states)."""

    bitmask: torch.Tensor
    rows: list[int]
    apply: object  # GrammarCompiler.apply_bitmask


@dataclass
class Logprobs:
    """Device tensors for the rows of one step that asked for logprobs; ``rows`` are their
    indexes among the step's sampling requests."""

    rows: list[int]
    chosen: torch.Tensor  # [len(rows)] the sampled token's logprob
    top_ids: (
        torch.Tensor | None
    )  # [len(rows), k] the k likeliest tokens (k = the most any row asked)
    top_logprobs: torch.Tensor | None
    counts: list[int]  # how many alternatives each row asked for (its share of the k)


@dataclass
class PromptLogprobs:
    """Device tensors for the prompt tokens of one prefill step whose requests asked for prompt
    logprobs: row j scores the prompt token that follows position j of the step's scored rows."""

    uids: list[int]
    rows: list[int]  # how many rows each of ``uids`` has, in order
    chosen: torch.Tensor  # [sum(rows)] each prompt token's logprob
    top_ids: (
        torch.Tensor | None
    )  # [sum(rows), k] the k likeliest tokens (k = the most any request asked)
    top_logprobs: torch.Tensor | None
    counts: list[int]  # how many alternatives each of ``uids`` asked for


class LogitsProcessor:
    def __init__(
        self, vocab_size: int, max_rows: int, device: torch.device, eos_token_ids: tuple[int, ...]
    ) -> None:
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.device = device
        self.eos_token_ids = [
            t for t in eos_token_ids if 0 <= t < vocab_size
        ]  # a config may name one outside
        self.counts: torch.Tensor | None = None  # [max_rows, vocab] float32: generated tokens seen
        self.in_prompt: torch.Tensor | None = None  # [max_rows, vocab] bool: the prompt's tokens
        self.row_owner: dict[int, int] = {}  # page-table row -> uid whose counts it holds

    # ---- logprobs ------------------------------------------------------------------------------

    @staticmethod
    def raw_logprobs(
        logits: torch.Tensor, reqs: list[Req]
    ) -> tuple[list[int], torch.Tensor] | None:
        """The model's own log-softmax for the rows that want logprobs (OpenAI and vLLM report
        these, before penalties, bias, grammar or temperature). Taken before any edit."""
        rows = [i for i, r in enumerate(reqs) if r.params.logprobs]
        if not rows:
            return None
        picked = logits if len(rows) == len(reqs) else logits[to_device(rows, logits.device)]
        return rows, picked.log_softmax(dim=-1)

    @staticmethod
    def gather_logprobs(
        raw: tuple[list[int], torch.Tensor], reqs: list[Req], next_ids: torch.Tensor
    ) -> Logprobs:
        rows, logprobs = raw
        ids = next_ids if len(rows) == len(reqs) else next_ids[to_device(rows, next_ids.device)]
        chosen = logprobs.gather(1, ids.view(-1, 1)).squeeze(1)
        counts = [reqs[i].params.top_logprobs for i in rows]
        if max(counts) == 0:
            return Logprobs(rows, chosen, None, None, counts)
        top = logprobs.topk(max(counts), dim=-1)
        return Logprobs(rows, chosen, top.indices, top.values, counts)

    @staticmethod
    def prompt_logprobs(
        logits: torch.Tensor, targets: torch.Tensor, reqs: list[Req], rows: list[int]
    ) -> PromptLogprobs:
        """``logits`` [sum(rows), vocab] at the prompt positions of ``reqs`` scored this step,
        ``targets`` the prompt token after each position: their logprobs (the model's own)."""
        logprobs = logits.log_softmax(dim=-1)
        chosen = logprobs.gather(1, targets.view(-1, 1)).squeeze(1)
        counts = [req.params.prompt_logprobs for req in reqs]
        uids = [req.uid for req in reqs]
        if max(counts) == 0:
            return PromptLogprobs(uids, rows, chosen, None, None, counts)
        top = logprobs.topk(max(counts), dim=-1)
        return PromptLogprobs(uids, rows, chosen, top.indices, top.values, counts)

    # ---- edits ---------------------------------------------------------------------------------

    def apply(
        self, logits: torch.Tensor, reqs: list[Req], table_rows: list[int], masks: TokenMasks | None
    ) -> None:
        """Edit ``logits`` ([len(reqs), vocab], one row per sampling request) in place."""
        if masks is not None and masks.rows:
            masks.apply(logits, masks.bitmask, masks.rows)
        if not any(r.params.changes_logits for r in reqs):
            return
        self._logit_bias(logits, reqs)
        self._ban_eos_before_min_tokens(logits, reqs)
        self._penalties(logits, reqs, table_rows)
        self._min_p(logits, reqs)

    def _logit_bias(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        rows, tokens, biases = [], [], []
        for i, req in enumerate(reqs):
            for token, bias in req.params.logit_bias.items():
                rows.append(i)
                tokens.append(token)
                biases.append(bias)
        if rows:
            index = to_device(rows + tokens, logits.device).view(2, -1)
            logits.index_put_(
                (index[0], index[1]),
                to_device(biases, logits.device, logits.dtype),
                accumulate=True,
            )

    def _ban_eos_before_min_tokens(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        rows, tokens = [], []
        for i, req in enumerate(reqs):
            # output_len counts the tokens out so far; the one sampled now is number output_len + 1.
            # A grammar decides its own end (banning it there would leave no token at all).
            if req.output_len < req.params.min_tokens and req.grammar is None:
                banned = set(req.params.stop_token_ids) | (
                    set() if req.params.ignore_eos else set(self.eos_token_ids)
                )
                rows.extend([i] * len(banned))
                tokens.extend(banned)
        if rows:
            index = to_device(rows + tokens, logits.device).view(2, -1)
            logits[index[0], index[1]] = float("-inf")

    def _penalties(self, logits: torch.Tensor, reqs: list[Req], table_rows: list[int]) -> None:
        rows = [i for i, r in enumerate(reqs) if r.params.has_penalties]
        if not rows:
            return
        self._admit(reqs, rows, table_rows)
        params = [reqs[i].params for i in rows]
        packed = to_device(rows + [table_rows[i] for i in rows], logits.device).view(2, -1)
        factors = to_device(
            [p.frequency_penalty for p in params]
            + [p.presence_penalty for p in params]
            + [p.repetition_penalty for p in params],
            logits.device,
            logits.dtype,
        ).view(3, -1, 1)
        index, slots = packed[0], packed[1]
        counts = self.counts[slots]
        picked = logits[index]
        seen = counts > 0
        # vLLM's repetition penalty: every token of the prompt or the output so far is made
        # less likely (a positive logit divided, a negative one multiplied)
        repeated = seen | self.in_prompt[slots]
        picked = torch.where(
            repeated, torch.where(picked > 0, picked / factors[2], picked * factors[2]), picked
        )
        # OpenAI's: frequency by how often a token was generated, presence once it was
        picked = picked - factors[0] * counts - factors[1] * seen.to(picked.dtype)
        logits[index] = picked

    def _admit(self, reqs: list[Req], rows: list[int], table_rows: list[int]) -> None:
        """Set the counts of rows whose request is new to its page-table row."""
        if self.counts is None:
            self.counts = torch.zeros(
                self.max_rows, self.vocab_size, dtype=torch.float32, device=self.device
            )
            self.in_prompt = torch.zeros(
                self.max_rows, self.vocab_size, dtype=torch.bool, device=self.device
            )
        for i in rows:
            req, slot = reqs[i], table_rows[i]
            if self.row_owner.get(slot) == req.uid:
                continue
            self.row_owner[slot] = req.uid
            prompt = req.token_ids[: req.prompt_len]
            output = [t for t in req.output_ids if t != PLACEHOLDER]
            ids = to_device(prompt + output, self.device)
            self.counts[slot].zero_()
            self.in_prompt[slot].zero_()
            self.in_prompt[slot, ids[: len(prompt)]] = True
            if output:
                self.counts[slot].index_add_(
                    0, ids[len(prompt) :], torch.ones(len(output), device=self.device)
                )

    def record(self, reqs: list[Req], table_rows: list[int], next_ids: torch.Tensor) -> None:
        """Count each penalized request's sampled token (on the device, after sampling)."""
        rows = [i for i, r in enumerate(reqs) if r.params.has_penalties]
        if not rows:
            return
        packed = to_device(rows + [table_rows[i] for i in rows], self.device).view(2, -1)
        ones = torch.ones(len(rows), dtype=self.counts.dtype, device=self.device)
        self.counts.index_put_((packed[1], next_ids[packed[0]]), ones, accumulate=True)

    @staticmethod
    def _min_p(logits: torch.Tensor, reqs: list[Req]) -> None:
        """Drop tokens whose probability (at the request's temperature) is below min_p times the
        likeliest token's; greedy rows need nothing."""
        rows = [i for i, r in enumerate(reqs) if r.params.min_p > 0 and not r.params.is_greedy]
        if not rows:
            return
        packed = to_device(
            [reqs[i].params.temperature for i in rows] + [reqs[i].params.min_p for i in rows],
            logits.device,
            torch.float32,
        ).view(2, -1, 1)
        index = to_device(rows, logits.device)
        picked = logits[index]
        probs = (picked / packed[0]).softmax(dim=-1)
        drop = probs < probs.max(dim=-1, keepdim=True).values * packed[1]
        logits[index] = picked.masked_fill(drop, float("-inf"))
