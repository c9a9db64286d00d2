"""Vocabulary-parallel embedding and LM head: each TP rank holds a
contiguous slice of the vocabulary."""
import torch
import torch.nn.functional as F
from torch import nn

from parashift.deterministic import matmul as invariant
from parashift.lazy_tensor import as_tensor
from parashift.context import get_context


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        tp = get_context().vocab
        self.vocab_size = vocab_size
        self.shard_size = (vocab_size + tp.size - 1) // tp.size
        self.vocab_start = tp.rank * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rows = as_tensor(loaded[self.vocab_start:self.vocab_start + self.shard_size])
        param.data[:rows.shape[0]].copy_(rows)
        param.data[rows.shape[0]:].zero_()

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        tp = get_context().vocab
        if tp.size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.vocab_start
        in_shard = (local >= 0) & (local < self.shard_size)
        y = F.embedding(local.clamp(0, self.shard_size - 1), self.weight)
        y = y * in_shard.unsqueeze(-1).to(y.dtype)
        return tp.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for this rank's vocabulary slice, gathered in vocabulary order.

    Under a shift plan the active TP group (SP_TP) is `parts` times the vocabulary group,
    and position t * parts + s of it holds vocabulary shard t: it computes part s of that
    shard (a view, no copy), so the gather over SP_TP is in vocabulary order again and each
    rank streams 1/parts of the head it holds."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__(vocab_size, hidden_size)
        self.matmul = invariant.linear if get_context().reduction_chunks else F.linear

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        vocab, tp = ctx.vocab, ctx.tp
        parts = tp.size // vocab.size
        if parts > 1 and self.shard_size % parts == 0:
            rows = self.shard_size // parts
            part = tp.rank % parts
            logits = tp.all_gather(self.matmul(hidden, self.weight[part * rows:(part + 1) * rows],
                                               None))
        else:
            logits = vocab.all_gather(self.matmul(hidden, self.weight, None), dim=-1)
        return logits if logits.shape[-1] == self.vocab_size else logits[..., :self.vocab_size]
