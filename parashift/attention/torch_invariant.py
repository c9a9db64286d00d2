"""Batch-invariant attention in PyTorch (the CPU path of deterministic mode): a query's
output depends only on its position, its sequence's KV and its head, never on the other
queries of its chunk, the chunking of the prompt, the other sequences of the step or how
many heads the rank holds.

Per sequence: scores of every query against the context padded to a multiple of
KEY_TILE (batched over heads, query rows padded as in `deterministic.matmul`); keys past
a query's position masked; one exact max per row; then the weighted values and the
softmax's denominator (a column of ones beside the values) summed tile by tile of
KEY_TILE keys in position order. Tiles past a query's position add exact zeros."""
import torch

from parashift.attention.torch_ref import TorchAttentionBackend
from parashift.deterministic.matmul import pad_rows

KEY_TILE = 64


class InvariantTorchAttentionBackend(TorchAttentionBackend):
    name = "torch-invariant"

    def attend_sequence(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        scale: float) -> torch.Tensor:
        q_len, (heads, seq_len, d) = q.shape[0], k.shape
        keys = -(-seq_len // KEY_TILE) * KEY_TILE
        k, v = _padded_keys(k, keys), _padded_keys(v, keys)
        qh = pad_rows(q.float().transpose(0, 1).contiguous())  # [heads, rows, d]
        scores = torch.bmm(qh, k.transpose(1, 2).contiguous()) * scale
        query_pos = torch.arange(qh.shape[1], device=q.device) + (seq_len - q_len)
        hidden = torch.arange(keys, device=q.device)[None, :] > query_pos[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.exp(scores - scores.amax(-1, keepdim=True))
        values = torch.cat([v, v.new_ones(heads, keys, 1)], dim=-1)  # the ones sum the weights
        acc = torch.zeros(heads, qh.shape[1], d + 1, device=q.device)
        for start in range(0, keys, KEY_TILE):
            tile = slice(start, start + KEY_TILE)
            acc += torch.bmm(probs[:, :, tile].contiguous(), values[:, tile].contiguous())
        out = acc[..., :d] / acc[..., d:]
        return out[:, :q_len].transpose(0, 1).to(q.dtype)


def _padded_keys(kv: torch.Tensor, keys: int) -> torch.Tensor:
    """[heads, seq_len, d] -> [heads, keys, d] in fp32, zeros after seq_len."""
    kv = kv.float()
    pad = keys - kv.shape[1]
    return torch.cat([kv, kv.new_zeros(kv.shape[0], pad, kv.shape[2])], 1) if pad else kv
