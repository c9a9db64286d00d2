"""How a plan reads a rank's KV pool. The pool's bytes are fixed at start-up, laid out for
the plan the rank loaded: per layer [num_blocks, block_size, kv_heads, head_dim]. A plan
whose ranks hold fewer KV heads each (a merged plan: 1/w of them) reads the same bytes as
[num_blocks, block_size * held / used, used, head_dim]: a block holds more tokens of fewer
heads, and the block ids, the count and the memory stay the same."""
import torch

from parashift.parallel.plan import Plan


def kv_heads_per_rank(plan: Plan, total_kv_heads: int) -> int:
    """KV heads each rank of `plan` holds: an even split, or one (replicated) when too few."""
    return max(1, total_kv_heads // plan.attn_degree)


def tokens_per_block(plan: Plan, loaded: Plan, total_kv_heads: int, block_size: int) -> int:
    """Tokens in one block of the pool when `plan` reads a pool laid out for `loaded`."""
    held = kv_heads_per_rank(loaded, total_kv_heads)
    used = kv_heads_per_rank(plan, total_kv_heads)
    if held % used:
        raise ValueError(f"plan {plan.name()} uses {used} KV heads per rank of a pool laid out "
                         f"for {held} ({loaded.name()}): no view of the pool fits")
    return block_size * held // used


def view_pool(pool: torch.Tensor, block_tokens: int) -> torch.Tensor:
    """`pool` ([layers, blocks, block_size, heads, head_dim]) as blocks of `block_tokens`."""
    layers, blocks, block_size, heads, head_dim = pool.shape
    return pool.view(layers, blocks, block_tokens, heads * block_size // block_tokens, head_dim)
