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


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
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

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> torch.Tensor:
        """logits: [batch, vocab] float32. Returns [batch] token ids (on the logits' device).

        Nothing here waits for the GPU (every index and parameter is copied without blocking),
        so the scheduler can prepare the next step while this one runs."""
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        unseeded = [i for i in rows if generators[i] is None] if self.use_flashinfer else []
        if unseeded and len(unseeded) == len(params):  # all sampled, none seeded: one draw, no argmax pass
            return self._gpu_sample(logits, params).long()
        next_ids = logits.argmax(dim=-1)
        if not rows:
            return next_ids
        if self.use_flashinfer:
            if unseeded:
                index = to_device(unseeded, logits.device)
                next_ids[index] = self._gpu_sample(logits[index], [params[i] for i in unseeded]).long()
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
            from .triton_kernels import gumbel_sample

            seed = int(torch.randint(2**31 - 1, (), generator=self.draw_seeds))
            return gumbel_sample(logits, to_device([p.temperature for p in params], device, torch.float32), seed)
        import flashinfer

        # one copy for all three parameters (top-k values are exact in float32: below 2**24)
        packed = to_device([p.temperature for p in params] + top_k + top_p, device, torch.float32).view(3, -1)
        scaled = logits / packed[0].unsqueeze(1)
        return flashinfer.sampling.top_k_top_p_sampling_from_logits(scaled, packed[1].int(), packed[2])

    @staticmethod
    def _torch_sample(logits, params, generators, rows: list[int], next_ids: torch.Tensor) -> torch.Tensor:
        device = logits.device
        idx = to_device(rows, device)
        packed = to_device([params[i].temperature for i in rows] + [params[i].top_k for i in rows] + [params[i].top_p for i in rows],
                           device, torch.float64).view(3, -1)
        temps, top_k, top_p = packed[0].to(logits.dtype), packed[1].long(), packed[2].to(logits.dtype)
        probs = filter_top_k_top_p(logits[idx] / temps.unsqueeze(1), top_k, top_p).softmax(dim=-1)
        # a row with inf/NaN logits (a broken model output) would make multinomial raise and take
        # the whole scheduler down: such a row takes its argmax instead
        broken = ~torch.isfinite(probs).all(dim=-1, keepdim=True)
        probs = torch.where(broken, torch.nn.functional.one_hot(next_ids[idx], probs.shape[-1]).to(probs.dtype), probs)
        for j, i in enumerate(rows):
            # one draw per row from that request's own generator, so a seeded request's text
            # does not depend on which other requests share its batch
            next_ids[i] = torch.multinomial(probs[j], 1, generator=generators[i]).squeeze(0)
        return next_ids
