"""Turns a batch's logits into next tokens; one batch may mix greedy and sampled requests,
each with its own temperature, top-k, top-p and seed.

Greedy rows take the argmax. On CUDA, sampled rows without a seed and without top-k / top-p
draw by the Gumbel-max trick in one pass over the logits (``triton_kernels.gumbel_sample``);
with top-k / top-p they go through FlashInfer's fused rejection sampler in one launch; a seeded
row draws from its own generator (torch), so its text does not depend on which other requests
share its batch.
"""

from __future__ import annotations

import torch

from .sampling_params import SamplingParams
from .transfer import to_device


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set to -inf every logit outside each row's top-k and its top-p nucleus.

    logits: [batch, vocab] (already divided by temperature); top_k: [batch] ints (<= 0 or >=
    vocab = off); top_p: [batch] floats (1 = off). The most likely token always survives.
    """
    vocab = logits.shape[-1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).unsqueeze(1)
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # a token is dropped when the tokens ranked before it already cover top_p of the mass
    mass_before = probs.cumsum(dim=-1) - probs
    # rows with top_p == 1 skip the test: a float32 running sum can reach 1.0 before the tail
    drop |= (mass_before >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


# top-k / top-p look at each row's best CANDIDATES tokens first and sort the whole vocabulary only
# when those do not hold the nucleus: on CPU a 49k-token sort took 3.4 ms a step and a
# multinomial draw over it 1 ms, as long as the demo model's whole decode step
CANDIDATES = 256


def sampling_distribution(
    scaled: torch.Tensor, top_k: list[int], top_p: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities [rows, n], their token ids [rows, n]) of each row's top-k / top-p
    distribution over logits already divided by the temperature; the same distribution as
    ``filter_top_k_top_p(...).softmax()``, over n <= vocab candidates."""
    rows, vocab = scaled.shape
    k_eff = [k if 0 < k < vocab else vocab for k in top_k]
    if all(k == vocab for k in k_eff) and all(p >= 1 for p in top_p):  # no filter: every token
        return scaled.softmax(dim=-1), torch.arange(vocab, device=scaled.device).expand(rows, vocab)
    count = min(vocab, max(CANDIDATES, *[k for k in k_eff if k < vocab], 0))
    if (
        count < vocab and scaled.is_cpu
    ):  # (a GPU sorts fast, and checking the candidates would wait for it)
        values, tokens = scaled.topk(count, dim=-1)  # sorted, best first
        k = torch.tensor(k_eff, device=scaled.device).unsqueeze(1)
        ranks = torch.arange(count, device=scaled.device)
        in_k = ranks < k
        # each row's normalizer: over its top-k when that lies in the candidates, else the whole row
        within = values.masked_fill(~in_k, float("-inf")).logsumexp(dim=-1, keepdim=True)
        normalizer = torch.where(k <= count, within, scaled.logsumexp(dim=-1, keepdim=True))
        probs = (values - normalizer).exp().masked_fill(~in_k, 0.0)
        p = torch.tensor(top_p, device=scaled.device, dtype=scaled.dtype).unsqueeze(1)
        held = (k <= count) | (
            probs.sum(dim=-1, keepdim=True) >= p
        )  # the nucleus lies in the candidates
        if bool(held.all()):
            drop = ~in_k | ((probs.cumsum(dim=-1) - probs >= p) & (p < 1))
            drop[:, 0] = False
            return values.masked_fill(drop, float("-inf")).softmax(dim=-1), tokens
    k_t = torch.tensor(top_k, device=scaled.device)
    p_t = torch.tensor(top_p, device=scaled.device, dtype=scaled.dtype)
    return filter_top_k_top_p(scaled, k_t, p_t).softmax(dim=-1), torch.arange(
        vocab, device=scaled.device
    ).expand(rows, vocab)


def draw(
    probs: torch.Tensor, tokens: torch.Tensor, vocab: int, generator: torch.Generator | None
) -> torch.Tensor:
    """One token id drawn from ``probs`` [n] over the ids ``tokens`` [n].

    A seeded request (``generator``) runs an exponential race: each vocabulary id gets its own
    uniform number u and the id with the largest p / -log(u) wins, which picks each id with
    probability p. The random numbers belong to ids, not to slices of a running sum, so a tiny
    change in the probabilities (the same request computed in another batch shifts its logits by
    ~1e-3 on CPU) changes the draw only where two ids nearly tie; an inverse-CDF draw changed it
    whenever u fell among the many unlikely tokens, whose thin slices move with the rounding of
    every probability before them (a seeded reply then depended on its batch). The race costs
    ~0.4 ms more a row on CPU (49k random numbers), so unseeded rows keep the inverse CDF: one
    uniform number, a running sum and a binary search (torch.multinomial took 1 ms)."""
    if generator is None:
        cdf = probs.cumsum(dim=0)
        u = torch.rand(1, device=probs.device, dtype=cdf.dtype) * cdf[-1]
        return tokens[torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[0] - 1)[0]]
    noise = torch.rand(vocab, generator=generator, device=probs.device, dtype=torch.float32)
    wait = -noise.index_select(0, tokens).log()  # exponential waiting times, one per id
    return tokens[(probs.float() / wait).argmax()]


class Sampler:
    def __init__(self, use_flashinfer: bool = False, seed: int | None = None) -> None:
        """``seed``: where the GPU draws' seeds start (tensor parallelism: every rank passes the
        same, so every rank samples the same tokens); None: a fresh random start."""
        self.use_flashinfer = use_flashinfer
        # one seed per GPU draw, taken on the host: no read of GPU state, no wait
        self.draw_seeds = torch.Generator()
        if seed is None:
            self.draw_seeds.seed()
        else:
            self.draw_seeds.manual_seed(seed)

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        """logits: [batch, vocab] float32. Returns [batch] token ids (on the logits' device).

        Nothing here waits for the GPU (every index and parameter is copied without blocking),
        so the scheduler can prepare the next step while this one runs."""
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        unseeded = [i for i in rows if generators[i] is None] if self.use_flashinfer else []
        if unseeded and len(unseeded) == len(
            params
        ):  # all sampled, none seeded: one draw, no argmax pass
            return self._gpu_sample(logits, params).long()
        next_ids = logits.argmax(dim=-1)
        if not rows:
            return next_ids
        if self.use_flashinfer:
            if unseeded:
                index = to_device(unseeded, logits.device)
                next_ids[index] = self._gpu_sample(
                    logits[index], [params[i] for i in unseeded]
                ).long()
            rows = [i for i in rows if generators[i] is not None]
            if not rows:
                return next_ids
        return self._torch_sample(logits, params, generators, rows, next_ids)

    def _gpu_sample(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """One row of ``logits`` per entry of ``params``: one Gumbel-max pass when no row
        filters (the temperature applied inside it), else FlashInfer's fused kernels."""
        vocab = logits.shape[-1]
        device = logits.device
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p for p in params]
        if all(k == vocab for k in top_k) and all(p == 1.0 for p in top_p):
            from .kernels.triton_kernels import gumbel_sample

            seed = int(torch.randint(2**31 - 1, (), generator=self.draw_seeds))
            return gumbel_sample(
                logits, to_device([p.temperature for p in params], device, torch.float32), seed
            )
        import flashinfer

        # one copy for all three parameters (top-k values are exact in float32: below 2**24)
        packed = to_device(
            [p.temperature for p in params] + top_k + top_p, device, torch.float32
        ).view(3, -1)
        scaled = logits / packed[0].unsqueeze(1)
        return flashinfer.sampling.top_k_top_p_sampling_from_logits(
            scaled, packed[1].int(), packed[2]
        )

    @staticmethod
    def _torch_sample(
        logits, params, generators, rows: list[int], next_ids: torch.Tensor
    ) -> torch.Tensor:
        device = logits.device
        idx = to_device(rows, device)
        temps = to_device([params[i].temperature for i in rows], device, torch.float64).to(
            logits.dtype
        )
        scaled = logits[idx] / temps.unsqueeze(1)
        for j, i in enumerate(rows):
            # each row's distribution from its own parameters only, and one draw from that
            # request's own generator, so a seeded request's text does not depend on which
            # other requests share its batch (a batch-wide call would list a row's candidates
            # best-first when another row filters, in vocabulary order when none does: the
            # same uniform number then lands on a different token)
            probs, tokens = sampling_distribution(
                scaled[j : j + 1], [params[i].top_k], [params[i].top_p]
            )
            # a row with inf/NaN logits (a broken model output) has no distribution to draw
            # from: it keeps its argmax
            broken = ~torch.isfinite(probs[0]).all() | (probs[0].sum() <= 0)
            drawn = draw(probs[0], tokens[0], logits.shape[-1], generators[i])
            next_ids[i] = torch.where(broken, next_ids[i], drawn)
        return next_ids
