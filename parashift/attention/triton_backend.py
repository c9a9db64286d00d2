"""Attention over the paged KV pool with Triton kernels (CUDA).

`attend` takes decode, prefill and mixed batches through one kernel; launch
shapes come from tensor shapes and the metadata's Python ints, never from
tensor values, so a step runs without host syncs and can be captured in a CUDA
graph. A captured graph keeps the split count chosen at capture; it stays
correct for any context length, only less tuned."""
import functools
import math
from dataclasses import dataclass

import torch
import triton

from parashift.attention.metadata import AttentionMetadata
from parashift.attention.triton_kernels import (paged_attention_kernel, reduce_splits_kernel,
                                                write_kv_kernel)

# Split-KV targets about this many programs per SM, and gives each split at
# least MIN_SPLIT_TOKENS of context.
PROGRAMS_PER_SM = 4
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 64
# Upper bound on the fp32 partial buffer of split-KV, in bytes.
MAX_PARTIAL_BYTES = 64 << 20
SMEM_BUDGET = 160 << 10


@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    tile_n: int
    num_warps: int
    num_stages: int


def decode_config(head_dim: int, group_p: int, elem_size: int) -> KernelConfig:
    tile_n = 64 if head_dim * elem_size <= 256 else 32
    return KernelConfig(max(16, group_p), tile_n, num_warps=4, num_stages=3)


def prefill_config(head_dim: int, group_p: int, elem_size: int) -> KernelConfig:
    block_m = max(128 if head_dim <= 128 else 64, group_p)
    tile_n = 64 if head_dim <= 128 else 32
    stages = 2
    while _smem_bytes(block_m, tile_n, head_dim, elem_size, stages) > SMEM_BUDGET:
        if stages > 1:
            stages -= 1
        elif tile_n > 16:
            tile_n //= 2
        else:
            block_m //= 2
    return KernelConfig(block_m, tile_n, num_warps=8 if block_m >= 128 else 4, num_stages=stages)


def _smem_bytes(block_m, tile_n, head_dim, elem_size, stages):
    return (block_m * head_dim + 2 * stages * tile_n * head_dim) * elem_size


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # the Triton interpreter, in tests
        return 132
    return _cuda_num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_programs: int, max_seq_len: int, partial_bytes_per_split: int,
                      num_sms: int) -> int:
    """Enough splits to give every SM work, none shorter than MIN_SPLIT_TOKENS."""
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, max(num_programs, 1))
    by_length = triton.cdiv(max_seq_len, MIN_SPLIT_TOKENS)
    by_memory = MAX_PARTIAL_BYTES // max(partial_bytes_per_split, 1)
    splits = min(wanted, by_length, by_memory, MAX_SPLITS)
    return 1 if splits <= 1 else triton.next_power_of_2(splits)


class TritonAttentionBackend:
    name = "triton"

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        num_tokens, num_kv_heads, head_dim = k.shape
        if num_tokens == 0:
            return
        k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
        _check_cache(k_cache, v_cache)
        write_kv_kernel[(num_tokens,)](
            k, v, k_cache, v_cache, meta.slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            *k_cache.stride()[:3], *v_cache.stride()[:3],
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
            HEADS_P=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM_P=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1])

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        num_tokens, num_heads, head_dim = q.shape
        out = torch.empty_like(q)
        real_tokens = meta.query_start_loc_cpu[-1] if meta.num_seqs else 0
        if real_tokens < num_tokens:
            out[real_tokens:].zero_()
        if meta.num_seqs == 0 or real_tokens == 0:
            return out
        q = _last_dim_contiguous(q)
        _check_cache(k_cache, v_cache)
        launch = _plan_launch(q, k_cache, meta)
        _launch_attention(out, q, k_cache, v_cache, meta, scale, launch)
        return out


@dataclass(frozen=True)
class _Launch:
    config: KernelConfig
    group: int
    group_p: int
    block_q: int
    num_q_blocks: int
    num_splits: int


def _plan_launch(q, k_cache, meta: AttentionMetadata) -> _Launch:
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not share {num_kv_heads} KV heads evenly")
    group = num_heads // num_kv_heads
    group_p = triton.next_power_of_2(group)
    elem_size = max(q.element_size(), k_cache.element_size())
    if meta.max_query_len <= 1:
        config = decode_config(head_dim, group_p, elem_size)
    else:
        config = prefill_config(head_dim, group_p, elem_size)
    block_q = max(1, config.block_m // group_p)
    num_q_blocks = num_tokens // block_q + meta.num_seqs
    partial_bytes = num_tokens * num_heads * (head_dim + 2) * 4
    num_splits = choose_num_splits(num_q_blocks * num_kv_heads, meta.max_seq_len,
                                   partial_bytes, _num_sms(q.device))
    return _Launch(config, group, group_p, block_q, num_q_blocks, num_splits)


def _launch_attention(out, q, k_cache, v_cache, meta, scale, launch: _Launch):
    num_tokens, num_heads, head_dim = q.shape
    split = launch.num_splits > 1
    if split:
        part_acc = torch.empty(num_tokens, num_heads, launch.num_splits, head_dim,
                               dtype=torch.float32, device=q.device)
        part_m = torch.empty(num_tokens, num_heads, launch.num_splits,
                             dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused by the kernel
    cfg = launch.config
    grid = (launch.num_q_blocks, k_cache.shape[2], launch.num_splits)
    paged_attention_kernel[grid](
        out, part_acc, part_m, part_l, q, k_cache, v_cache,
        meta.block_tables, meta.seq_lens, meta.query_start_loc,
        meta.num_seqs, scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], meta.block_tables.stride(0),
        GROUP=launch.group, GROUP_P=launch.group_p, BLOCK_Q=launch.block_q,
        BLOCK_M=cfg.block_m, TILE_N=cfg.tile_n, BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim), SPLIT=split,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split:
        reduce_splits_kernel[(num_tokens, num_heads)](
            out, part_acc, part_m, part_l, meta.query_start_loc, meta.num_seqs,
            out.stride(0), out.stride(1),
            NUM_SPLITS=launch.num_splits, NUM_SPLITS_P=triton.next_power_of_2(launch.num_splits),
            HEAD_DIM=head_dim, HEAD_DIM_P=triton.next_power_of_2(head_dim), num_warps=4)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("KV cache head_dim must be contiguous")
