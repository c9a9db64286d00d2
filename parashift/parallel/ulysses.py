"""Ulysses sequence parallelism for inference.

Each SP rank holds a contiguous slice of the step's tokens (padded to a multiple
of SP). Before attention an all-to-all turns q/k/v from token-sharded to
head-sharded: every rank receives all tokens for its block of heads. After
attention a second all-to-all turns the output back. When a rank's KV heads
cannot be split over SP, each peer is sent the KV head its query heads use
(replicated before the all-to-all)."""
import torch

from parashift.parallel.state import GroupHandle


def kv_heads_for_block(block: int, num_blocks: int, num_heads: int, num_kv_heads: int) -> list[int]:
    """Indices of the KV heads that query-head block `block` (of `num_blocks`) attends with."""
    heads_per_block = num_heads // num_blocks
    group = num_heads // num_kv_heads
    first = block * heads_per_block // group
    last = ((block + 1) * heads_per_block - 1) // group
    return list(range(first, last + 1))


def scatter_heads(sp: GroupHandle, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """[local_tokens, heads, d] on each rank -> [all_tokens, heads / sp, d], in one
    all-to-all: each peer's q, k and v heads travel packed in one buffer."""
    num_heads, num_kv_heads, d = q.shape[1], k.shape[1], q.shape[2]
    q_chunks = q.chunk(sp.size, dim=1)
    packed = []
    for j in range(sp.size):
        kv_index = kv_heads_for_block(j, sp.size, num_heads, num_kv_heads)
        kv = slice(kv_index[0], kv_index[-1] + 1)
        packed.append(torch.cat([q_chunks[j].flatten(1), k[:, kv].flatten(1),
                                 v[:, kv].flatten(1)], dim=1))
    tokens = torch.cat(sp.all_to_all(packed), dim=0)
    q_width = q_chunks[0].shape[1] * d
    kv_width = (tokens.shape[1] - q_width) // 2
    q, k, v = tokens.split([q_width, kv_width, kv_width], dim=1)
    return q.unflatten(1, (-1, d)), k.unflatten(1, (-1, d)), v.unflatten(1, (-1, d))


def gather_heads(sp: GroupHandle, o: torch.Tensor) -> torch.Tensor:
    """[all_tokens, heads / sp, d] -> [local_tokens, heads, d] (heads in order)."""
    parts = sp.all_to_all(list(o.chunk(sp.size, dim=0)))
    return torch.cat(parts, dim=1)
