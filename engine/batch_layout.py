"""A scheduled :class:`Batch` laid out as the model's input, a :class:`ForwardBatch`: every
request's new tokens back to back as flat lists on the host, then one copy to the device that
carries the page table's pending writes too."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch import Batch, ForwardBatch
from .kvcache import PageTable
from .request import PLACEHOLDER
from .transfer import to_device


def build_forward_batch(
    batch: Batch,
    page_table: PageTable,
    last_token: torch.Tensor,
    padding_slot: int,
    device: torch.device,
    pad_to: int | None = None,
) -> ForwardBatch:
    """``batch`` as flat tensors on ``device``. ``last_token`` holds each page-table row's newest
    sampled token, the input of a decode step whose token the CPU has not read yet (overlap);
    ``pad_to`` adds padding rows to a decode batch (CUDA graphs), their K/V written to
    ``padding_slot``."""
    reqs = batch.reqs
    cached_lens = [req.cached_len for req in reqs]
    rows = [req.table_slot for req in reqs]
    assert pad_to is None or batch.is_decode, (
        "only a decode batch is padded (to a CUDA graph's size)"
    )
    layout = (
        _decode_layout(batch, cached_lens, rows, pad_to)
        if batch.is_decode
        else _prefill_layout(batch)
    )
    ids_t, pos_t, token_rows_t, rows_t, logits_t, targets_t = _copy_to_device(
        layout, rows, page_table, device
    )
    if PLACEHOLDER in layout.input_ids:  # tokens still on the GPU (overlap): take them from there
        ids_t = torch.where(ids_t >= 0, ids_t, last_token[token_rows_t])
    out_loc = page_table.table[token_rows_t, pos_t]
    if layout.num_padding:
        out_loc[len(reqs) :] = padding_slot
    return ForwardBatch(
        phase=batch.phase,
        input_ids=ids_t,
        positions=pos_t,
        out_loc=out_loc,
        table_rows=rows_t,
        cached_lens=cached_lens,
        extend_lens=list(batch.extend_lens),
        seq_lens=[c + e for c, e in zip(cached_lens, batch.extend_lens)],
        logits_indices=logits_t,
        num_padding=layout.num_padding,
        scored_prompts=layout.scored_prompts,
        prompt_targets=targets_t,
        token_rows=token_rows_t,
    )


def _copy_to_device(
    layout: _HostLayout, rows: list[int], page_table: PageTable, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """The layout's lists and each request's table row in one host-to-device copy; the page
    table's pending pages are written into it on the device. Returns input ids, positions,
    token rows, request rows, logits indices and prompt targets."""
    n_tok, n_req = len(layout.input_ids), len(rows)
    logits, targets = layout.logits_indices, layout.prompt_targets
    # the pages the scheduler handed out since the last step travel in the same copy
    pt_rows, pt_cols, pt_pages = page_table.take_pending()
    n_pt = len(pt_rows)
    packed = to_device(
        layout.input_ids
        + layout.positions
        + layout.token_rows
        + rows
        + logits
        + targets
        + pt_rows
        + pt_cols
        + pt_pages,
        device,
    )
    *tensors, pt = packed.split([n_tok, n_tok, n_tok, n_req, len(logits), len(targets), 3 * n_pt])
    if n_pt:
        page_table.apply(*pt.view(3, n_pt))
    return tuple(tensors)


@dataclass
class _HostLayout:
    """A batch as flat lists on the host, before the one copy to the device (``ForwardBatch``
    says what each holds)."""

    input_ids: list[int]
    positions: list[int]
    token_rows: list[int]
    logits_indices: list[int]  # the sampling rows, then the scored prompt rows
    num_padding: int = 0
    prompt_targets: list[int] = field(default_factory=list)
    scored_prompts: list[tuple[int, int]] = field(default_factory=list)


def _decode_layout(
    batch: Batch, cached_lens: list[int], rows: list[int], pad_to: int | None
) -> _HostLayout:
    """One token per request (its newest, at position ``cached_lens[i]``, in table row
    ``rows[i]``), plus padding rows up to a CUDA graph's size."""
    reqs = batch.reqs
    layout = _HostLayout(
        [req.token_ids[c] for req, c in zip(reqs, cached_lens)],
        list(cached_lens),
        list(rows),
        list(range(len(reqs))),
    )
    if pad_to is not None:
        assert pad_to >= len(reqs)
        layout.num_padding = n = pad_to - len(reqs)
        layout.input_ids += [0] * n
        layout.positions += [0] * n
        layout.token_rows += [0] * n
        layout.logits_indices += range(len(reqs), pad_to)
    return layout


def _prefill_layout(batch: Batch) -> _HostLayout:
    """Each request's next ``extend_lens[i]`` prompt tokens; logits for the last one of each
    request that samples (every one with ``all_logits``), and for the prompt positions of
    requests that asked for prompt logprobs."""
    layout = _HostLayout([], [], [], [])
    scored_rows = []
    for i, (req, extend) in enumerate(zip(batch.reqs, batch.extend_lens)):
        start, first = req.cached_len, len(layout.input_ids)
        layout.input_ids.extend(req.token_ids[start : start + extend])
        layout.positions.extend(range(start, start + extend))
        layout.token_rows.extend([req.table_slot] * extend)
        if batch.all_logits:
            layout.logits_indices.extend(range(first, first + extend))
        elif batch.samples(i):
            layout.logits_indices.append(first + extend - 1)
        # position p scores prompt token p + 1; the last prompt position scores the first
        # output token (that is the sampled token's own logprob)
        end = min(start + extend, req.prompt_len - 1)
        if req.scores_prompt and not batch.all_logits and end > start:
            scored_rows.extend(range(first, first + end - start))
            layout.prompt_targets.extend(req.token_ids[start + 1 : end + 1])
            layout.scored_prompts.append((i, end - start))
    layout.logits_indices += scored_rows  # after the sampling rows
    return layout
