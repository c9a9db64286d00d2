"""Which split-K QKV GEMM writes its parts for the RoPE + KV-write kernel after it to sum
(issue 61: 8B decode at 33-64 rows; layers/split_parts_rotary.py wires it), chosen per weight
shape, heads and row bucket as decode runs the pair (gemm_timing.py's chain): each candidate
is a parts-out GEMM (split_parts_choice.parts_of) and the summing rotary kernel
(parts_rotary.py), the reference the layer's own GEMM (its measured choice) and the plain
rotary kernel (rotary.rotate_and_write_kv). bf16's QKV at 64 rows: 6144 / 64 = 96 programs of
the plain GEMM on 132 SMs (16.4 µs a layer against a 12.2 µs bytes floor).

PARASHIFT_SPLIT_PARTS_ROTARY: 0 (the default: unmeasured) or 1, read at each call (a CUDA
graph keeps what its capture read)."""
from typing import Hashable

import torch
import triton

from parashift.engine_switches import switch
from parashift.kernels import dense_gemm, fp8_gemm, gemm_timing, rotary, split_parts_choice
from parashift.kernels.parts_rotary import rotate_parts_and_write_kv
from parashift.kernels.split_parts_choice import MARGIN, parts_of

ENV, DEFAULT = "PARASHIFT_SPLIT_PARTS_ROTARY", "0"
# the norm pairs' candidates (the same compiled kernels): K in 2, and in 4 for QKV's 96
# weight tiles of 64 rows on 132 SMs (192 programs of half a tile's K leave 60 SMs two halves:
# no shorter than one whole tile; 384 quarters: three on the busiest SM)
FP8_CONFIGS, DENSE_CONFIGS = split_parts_choice.FP8_CONFIGS, split_parts_choice.DENSE_CONFIGS
BLOCK_SIZE = 16  # the timing pool's

_choices: dict[tuple, object] = {}


def enabled() -> bool:
    """PARASHIFT_SPLIT_PARTS_ROTARY (0 or 1)."""
    return switch(ENV, DEFAULT)


def choice(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
           num_q_heads: int, head_dim: int, cos_sin: torch.Tensor):
    """The parts-out config for the pair (the layer's QKV GEMM of x, the rotary kernel after
    it) where it measured faster, else None (gemm_timing.chosen_once: measured at the first
    call outside a CUDA graph capture)."""
    key = (triton.next_power_of_2(x.shape[0]), tuple(weight.shape), weight.stride(0),
           weight.dtype, x.dtype, x.device, num_q_heads, head_dim)
    return gemm_timing.chosen_once(
        _choices, key, lambda: _measure(x, weight, scale, num_q_heads, head_dim, cos_sin))


def _measure(x, weight, scale, num_q_heads, head_dim, cos_sin):
    return gemm_timing.steady_choice(
        timings_ms(x, weight, scale, num_q_heads, head_dim, cos_sin), MARGIN,
        f"split parts + rotary, {x.shape[0]} rows x {tuple(weight.shape)}", label)


def timings_ms(x, weight, scale, num_q_heads, head_dim, cos_sin) -> dict[Hashable, float]:
    """Median ms per (GEMM, rotary) pair: the layer's GEMM and the plain rotary kernel (None)
    and each candidate's parts and summing rotary kernel, replayed over copies of the weight
    in the chain; k and v written to a pool of their own (each token a slot)."""
    weights = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x)
    rows, k_heads = x.shape[0], (weight.shape[0] // head_dim - num_q_heads) // 2
    positions = torch.arange(rows, device=x.device)
    pool = (triton.cdiv(rows, BLOCK_SIZE), BLOCK_SIZE, k_heads, head_dim)
    k_cache, v_cache = (torch.empty(pool, dtype=x.dtype, device=x.device) for _ in range(2))

    def reference(i):
        y = (dense_gemm.linear(xin, weights[i], None) if scale is None
             else fp8_gemm.linear(xin, weights[i], scale, None))
        q, k, v = y.unflatten(-1, (-1, head_dim)).split([num_q_heads, k_heads, k_heads], -2)
        return rotary.rotate_and_write_kv(positions, q, k, v, cos_sin, k_cache, v_cache,
                                          positions)

    def summed(i, config):
        return rotate_parts_and_write_kv(positions, *parts_of(xin, weights[i], scale, config),
                                         num_q_heads, x.dtype, cos_sin, k_cache, v_cache,
                                         positions)

    reference(0)  # the layer's GEMM chooses its config first, outside the timing graphs
    configs = DENSE_CONFIGS if scale is None else FP8_CONFIGS
    runs = {None: reference}
    runs.update({c: lambda i, c=c: summed(i, c) for c in configs})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"rows": key[0], "weight": list(key[1]), "kernel": label(config)}
            for key, config in _choices.items()]


def label(config) -> str:
    return "the layer's GEMM + rotary" if config is None else split_parts_choice.label(config)
