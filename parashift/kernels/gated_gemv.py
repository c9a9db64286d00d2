"""SiLU-and-mul inside the gate_up projection's GEMV at one to four rows (decode), FP8 weights
(scale per row) and 16-bit ones (a scale of ones) alike (fp8_gemv.py's SILU_OUT): the GEMV
stores silu(gate) * up; each program's tile interleaves gate row j and up row I + j, and its
epilogue rounds both to the activations' dtype (as the plain GEMV stores them) and forms the
product once per output. No extra arithmetic, and the intermediate written is half as wide.
Only configs whose sums are the dispatch's GEMV config's bits are candidates, so it gives the
bits of that GEMV followed by silu_mul.silu_and_mul. A shape takes the fusion only where it
timed faster than the unfused pair, the GEMM its dispatch chose and SiLU-and-mul (`choice`),
timed as that dispatch times (gemm_timing.py). (SiLU-and-mul in the down GEMV, recomputed by
every column tile, was never chosen and was removed in session 51.)"""
from typing import Callable

import torch

from parashift.kernels import fp8_gemm, fp8_gemv, gemm_timing, silu_mul, skinny_gemm

MAX_ROWS = fp8_gemv.MAX_ROWS
_choices: dict[tuple, object] = {}


def args(config) -> tuple:
    """fp8_gemv's tile arguments of an FP8 GEMV Config or a skinny GemvConfig."""
    return (config.block_n, config.block_k, config.num_warps, getattr(config, "num_stages", 1),
            config.split_k, config.ahead, config.tickets)


def candidates(weight: torch.Tensor, unfused=None) -> list:
    """The GEMV configs measured for the fusion on this weight: those of one part of K whose
    sums are the unfused GEMV config's bit for bit (its block_k and warps: a row's sum runs
    along K in the same layout whatever the tile's rows), none where the dispatch chose
    another kernel, so the fusion moves no bits."""
    configs = fp8_gemm.GEMV_CONFIGS if weight.dtype == fp8_gemm.FP8 else skinny_gemm.GEMV_CONFIGS
    gemv = isinstance(unfused, skinny_gemm.GemvConfig) or (
        isinstance(unfused, fp8_gemm.Config) and unfused.kernel == "gemv")
    if not gemv or unfused.split_k != 1:
        return []
    return [c for c in configs if c.split_k == 1 and (c.block_k, c.num_warps) == (
        unfused.block_k, unfused.num_warps) and c.block_n <= max(weight.shape[0], 1)]


def _dispatch_choice(x: torch.Tensor, weight: torch.Tensor, scale, bias):
    """The config the GEMM dispatch measured for x on this weight (None: cuBLAS/cuBLASLt)."""
    module = skinny_gemm if scale is None else fp8_gemm
    return module.measured_choice(x.shape[0], weight, x.dtype, x.device, bias is not None)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                 bias: torch.Tensor | None, config) -> torch.Tensor:
    """x [M <= 4, K], weight [2 I, K] ([gate; up]) -> silu_and_mul(x W^T + b) [M, I]. W in
    E4M3 with scale [rows, 1], or 16-bit with scale None; one GEMV of `config`."""
    if scale is None:
        scale = skinny_gemm.unit_scale(weight.shape[0], x.device)
    return fp8_gemv.fp8_gemv(x, weight, scale, bias, *args(config), silu_out=True)


def dispatched_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """The GEMM the layers run: the bf16 or the FP8 dispatch."""
    if scale is None:
        return skinny_gemm.linear(x, weight, bias)
    return fp8_gemm.linear(x, weight, scale, bias)


def unfused_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """What the layers run without the fusion: the GEMM then SiLU-and-mul."""
    return silu_mul.silu_and_mul(dispatched_linear(x, weight, scale, bias))


def _key(x: torch.Tensor, weight: torch.Tensor, has_bias: bool) -> tuple:
    return (x.shape[0], tuple(weight.shape), weight.stride(0), weight.dtype, x.dtype, x.device,
            has_bias)


def choice(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
           bias: torch.Tensor | None):
    """The fusion's config for x on this weight where it measured faster than
    `unfused_linear`, else None. Measured on the shape's first call outside a CUDA graph
    capture; during a capture an unmeasured shape takes None."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or weight.stride(1) != 1 or \
            weight.shape[0] % 2:
        return None
    key = _key(x, weight, bias is not None)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return None
        unfused_linear(x, weight, scale, bias)  # the dispatch's own choice made first
        configs = candidates(weight, _dispatch_choice(x, weight, scale, bias))
        if not configs:
            _choices[key] = None
            return None
        with gemm_timing.timing_launches():
            timings = timings_ms(x, weight, scale, bias, configs)
        _choices[key] = gemm_timing.steady_choice(
            timings, skinny_gemm.MARGIN,
            f"SiLU-and-mul in the gate_up GEMV, {x.shape[0]} rows x {tuple(weight.shape)}",
            label)
    return _choices[key]


def timings_ms(x, weight, scale, bias, configs) -> dict:
    """Milliseconds per call of `unfused_linear` (None) and of each fused config, replayed
    from CUDA graphs over copies of the weight (gemm_timing)."""
    weights = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x)
    runs: dict[object, Callable[[int], object]] = {
        None: lambda i: unfused_linear(xin, weights[i], scale, bias)}
    runs.update({c: lambda i, c=c: fused_linear(xin, weights[i], scale, bias, c)
                 for c in configs})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def label(config) -> str:
    if config is None:
        return "unfused"
    return (f"gemv {config.block_n}x{config.block_k} split {config.split_k}"
            f"{' ahead' if config.ahead else ''}{' tickets' if config.tickets else ''}")


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"fusion": "gate_up", "rows": key[0], "weight": list(key[1]),
             "kernel": label(config)}
            for key, config in _choices.items()]
