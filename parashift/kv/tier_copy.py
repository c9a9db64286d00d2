"""Moving one request's KV between a rank's paged pool and the CPU KV tier. A rank of a
plan holds a slice of every request's KV: its pipeline stage's layers x its block of KV
heads (PP: some layers, every head; TP: every layer, some heads). `gather` copies the
request's tokens of that slice out of the pages its block table names into its tier
slot; `scatter` copies them from the slot into pages of another plan's pool. The slices
of a plan's ranks together cover the whole KV (ranks that replicate a head write the same
bytes), so whatever the ranks of one plan gather, the ranks of any other can scatter."""
import itertools
from dataclasses import dataclass

import torch

from parashift.kv.cpu_tier import CpuKVTier
from parashift.kv.tier_allocator import TierSlot
from parashift.parallel.plan import Plan


@dataclass(frozen=True)
class KVSlice:
    layers: range  # model layers, global indices; the pool's layer i is layers[i]
    heads: range   # KV heads, global indices; the pool's head j is heads[j]


def rank_kv_slice(plan: Plan, rank: int, num_layers: int, num_kv_heads: int) -> KVSlice:
    """The layers and KV heads `rank` holds under `plan` (a head is replicated over
    attn_degree / num_kv_heads ranks when there are fewer heads than ranks)."""
    degree = plan.attn_degree
    per_rank = max(1, num_kv_heads // degree)
    first = plan.head_block(rank) * num_kv_heads // degree
    layers = plan.stage_layers(num_layers, plan.coords(rank).pp)
    return KVSlice(layers, range(first, first + per_rank))


def token_slots(block_table: list[int], num_tokens: int, block_size: int,
                device: torch.device) -> torch.Tensor:
    """The pool slots (block * block_size + offset) of a request's first `num_tokens`."""
    positions = torch.arange(num_tokens, device=device)
    blocks = torch.tensor(block_table, dtype=torch.long, device=device)[positions // block_size]
    return blocks * block_size + positions % block_size


def _tier_view(tier: CpuKVTier, kv_slice: KVSlice, slot: TierSlot, num_tokens: int):
    """[layers, 2, heads, tokens, head_dim] of the tier: the slice's part of the slot."""
    layers, heads = kv_slice.layers, kv_slice.heads
    return tier.buffer[layers.start:layers.stop, :, heads.start:heads.stop,
                       slot.start:slot.start + num_tokens]


def _check(pool_k: torch.Tensor, kv_slice: KVSlice, slot: TierSlot, num_tokens: int) -> None:
    if pool_k.shape[0] != len(kv_slice.layers) or pool_k.shape[3] != len(kv_slice.heads):
        raise ValueError(f"a pool of {pool_k.shape[0]} layers x {pool_k.shape[3]} KV heads does "
                         f"not hold the slice {kv_slice}")
    if num_tokens > slot.length:
        raise ValueError(f"{num_tokens} tokens do not fit a CPU KV slot of {slot.length}")


def gather(pool_k: torch.Tensor, pool_v: torch.Tensor, block_table: list[int], num_tokens: int,
           kv_slice: KVSlice, tier: CpuKVTier, slot: TierSlot) -> int:
    """Copies a request's KV of this rank's slice from its pages into its tier slot
    (pools: [layers, blocks, block_size, heads, head_dim]); returns the bytes moved. On a
    CUDA pool the host copies are issued non-blocking: `wait_for_copies` before the tier
    is read."""
    _check(pool_k, kv_slice, slot, num_tokens)
    pool_k, pool_v = _bytes(pool_k), _bytes(pool_v)
    index = token_slots(block_table, num_tokens, pool_k.shape[2], pool_k.device)
    staged = _tokens_in_tier_order(pool_k, pool_v, index)
    out = _bytes(_tier_view(tier, kv_slice, slot, num_tokens))
    _copy_runs(out, staged, _contiguous_runs(out))
    return out.nbytes


def scatter(tier: CpuKVTier, slot: TierSlot, num_tokens: int, kv_slice: KVSlice,
            pool_k: torch.Tensor, pool_v: torch.Tensor, block_table: list[int]) -> int:
    """Copies a request's KV of this rank's slice from its tier slot into the pages of its
    block table; returns the bytes moved. On a CUDA pool the host copies are issued
    non-blocking: `wait_for_copies` before the slot is reused."""
    _check(pool_k, kv_slice, slot, num_tokens)
    pool_k, pool_v = _bytes(pool_k), _bytes(pool_v)
    layers, blocks, block_size, heads, head_dim = pool_k.shape
    index = token_slots(block_table, num_tokens, block_size, pool_k.device)
    src = _bytes(_tier_view(tier, kv_slice, slot, num_tokens))
    staged = torch.empty(src.shape, dtype=pool_k.dtype, device=pool_k.device)
    _copy_runs(staged, src, _contiguous_runs(src))
    for kv, pool in enumerate((pool_k, pool_v)):
        tokens = staged[:, kv].transpose(1, 2)  # HND -> NHD
        pool.view(layers, blocks * block_size, heads, head_dim).index_copy_(1, index, tokens)
    return src.nbytes


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """An FP8 pool or tier moved as its bytes (index copies take no float8 on the CPU)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def wait_for_copies(device: torch.device) -> None:
    """Waits for the host copies gather and scatter issued on `device` (once a transition
    or step, not per request)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _tokens_in_tier_order(pool_k: torch.Tensor, pool_v: torch.Tensor,
                          index: torch.Tensor) -> torch.Tensor:
    """The pools' tokens at `index` as one contiguous [layers, 2, heads, tokens, head_dim]
    tensor on the pools' device (the tier's order)."""
    layers, blocks, block_size, heads, head_dim = pool_k.shape
    staged = torch.empty(layers, 2, heads, len(index), head_dim, dtype=pool_k.dtype,
                         device=pool_k.device)
    for kv, pool in enumerate((pool_k, pool_v)):
        tokens = pool.view(layers, blocks * block_size, heads, head_dim).index_select(1, index)
        staged[:, kv].copy_(tokens.transpose(1, 2))  # NHD -> HND
    return staged


def _contiguous_runs(host: torch.Tensor) -> list[tuple[int, ...]]:
    """The indices over `host`'s leading dimensions whose blocks are its fewest, largest
    contiguous runs: per (layer, K/V, head) for a slot of part of the tier, larger where
    the slot spans the whole tier."""
    if host.numel() == 0:
        return []
    lead = next(n for n in range(host.dim() + 1) if host[(0,) * n].is_contiguous())
    return list(itertools.product(*map(range, host.shape[:lead])))


def _copy_runs(dst: torch.Tensor, src: torch.Tensor, runs: list[tuple[int, ...]]) -> None:
    """dst <- src one contiguous run at a time: DMA copies between a device and a
    page-locked host."""
    for run in runs:
        dst[run].copy_(src[run], non_blocking=True)
