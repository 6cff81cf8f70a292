"""The token embedding, split by vocabulary across tensor-parallel ranks: each rank holds a
block of rows, looks up the ids that fall in it (zeros for the others) and an all-reduce adds the
blocks up. The LM head reuses the same split: each rank's logits cover its block."""

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import all_reduce, get_tp
from ..weights.safetensors_io import read_tensor
from .quantized import NativeRows, QuantizedRows


def vocab_block(vocab_size: int) -> tuple[int, int]:
    """(first row, rows per rank) of this rank's vocabulary block; the last block is padded."""
    tp = get_tp()
    per_rank = -(-vocab_size // tp.size)
    return tp.rank * per_rank, per_rank


def split_by_vocab(param: nn.Parameter, vocab_size: int) -> None:
    """Mark a [rows of this rank's block, hidden] parameter as vocabulary-parallel: it loads
    its block of the checkpoint's [vocab, hidden] tensor (the embedding and an untied LM head)."""
    param.vocab_size = vocab_size
    param.weight_loader = load_vocab_block


def load_vocab_block(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Copy this rank's rows of a [vocab, hidden] checkpoint tensor (zero padding rows)."""
    start, per_rank = vocab_block(param.vocab_size)
    if loaded.shape[0] != param.vocab_size or loaded.shape[1:] != param.shape[1:]:
        raise ValueError(
            f"shape mismatch: parameter {param.vocab_size}x{tuple(param.shape[1:])}, checkpoint {tuple(loaded.shape)}"
        )
    rows = loaded[start : start + per_rank]
    param.data.zero_()
    param.data[: rows.shape[0]].copy_(read_tensor(rows))


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.vocab_size = num_embeddings
        self.start, per_rank = vocab_block(num_embeddings)
        self.weight = nn.Parameter(torch.empty(per_rank, dim), requires_grad=False)
        split_by_vocab(self.weight, num_embeddings)
        self.tp_size = get_tp().size
        # CPU, a GGUF's quantized table: its blocks, or a tied LM head's codes (``weight`` is then
        # a meta tensor)
        self.quant_rows: QuantizedRows | NativeRows | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant_rows is not None:
            return self.quant_rows.lookup(ids, self.weight.dtype)
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local * mine, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out)
