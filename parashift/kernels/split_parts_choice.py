"""Which split-K GEMM writes its parts for the residual-add RMSNorm after it to sum (issues
60/61: 8B decode at 33-64 rows; layers/split_parts_norm.py wires the pairs), chosen per weight
shape and row bucket as decode runs the pair (gemm_timing.py's chain): each candidate is a
parts-out GEMM (fp8_gemm_tma.tma_parts / dense_gemm_tma.tma_parts) and the summing norm
(parts_rmsnorm.py), the reference the layer's own GEMM (its measured choice: cuBLAS or a
Triton config) and the plain norm. The parts give N = 4096 (o_proj) 128-256 programs where
the plain GEMM's 64-row weight tiles give 64, and no ticket tail.

PARASHIFT_SPLIT_PARTS_NORM: 1 (the default: 8B bf16 decode at 64 rows 1.022x on an H200, every
round of three, o and down both taking parts; FP8 took none) or 0, read at each call (a CUDA
graph keeps what its capture read). Only without a bias: an FP8 tile's bias add may be
contracted into an FMA in the ticket path and not in the norm (fp8_epilogue.py)."""
from typing import Hashable

import torch
import triton

from parashift.engine_switches import switch
from parashift.kernels import dense_gemm, dense_gemm_tma, fp8_gemm, fp8_gemm_tma, gemm_timing
from parashift.kernels.parts_rmsnorm import parts_add_rms_norm
from parashift.kernels import rmsnorm

ENV, DEFAULT = "PARASHIFT_SPLIT_PARTS_NORM", "1"
MIN_ROWS, MAX_ROWS = 33, 64
MARGIN = 0.995  # a candidate must beat the GEMM and plain norm by this factor
# tma_w8a8 64-row weight tiles as the ticket configs' (fp8_gemm.TMA_CONFIGS), K in 2 or 4
FP8_CONFIGS = tuple(fp8_gemm.Config("tma_w8a8", *shape) for shape in (
    (64, 256, 4, 5, 2), (64, 256, 4, 4, 4)))
DENSE_CONFIGS = (dense_gemm_tma.Config(64, 64, 128, 4, 6, 2),
                 dense_gemm_tma.Config(64, 64, 256, 4, 3, 2),
                 dense_gemm_tma.Config(64, 64, 128, 4, 6, 4))

_choices: dict[tuple, object] = {}


def enabled() -> bool:
    """PARASHIFT_SPLIT_PARTS_NORM (0 or 1)."""
    return switch(ENV, DEFAULT)


def serves(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> bool:
    """Whether a parts-out GEMM can stand for the layer's GEMM of x: CUDA, 2-D x of
    MIN_ROWS..MAX_ROWS 16-bit rows, and the layer's GEMM the one these kernels follow (FP8:
    fp8_gemm's with TMA on; 16-bit: dense_gemm's)."""
    if not (x.is_cuda and x.dim() == 2 and MIN_ROWS <= x.shape[0] <= MAX_ROWS
            and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if scale is None:
        return dense_gemm.enabled() and dense_gemm.handles(x) and dense_gemm_tma.takes(weight)
    return (fp8_gemm_tma.enabled() and fp8_gemm_tma.takes(weight)
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0)


def parts_of(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, config,
             x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(parts [P, M, N] fp32, the weight rows' scales or None, the tokens' scales or None):
    what `parts_rmsnorm.parts_add_rms_norm` takes to finish the GEMM x weight^T (x_fp8: x
    quantized per token already)."""
    if scale is None:
        return dense_gemm_tma.tma_parts(x, weight, config), None, None
    xq, x_scale = x_fp8 or fp8_gemm.quantize_rows(x if x.stride(1) == 1 else x.contiguous())
    parts = fp8_gemm_tma.tma_parts(xq, weight, scale, config.block_n, config.block_k,
                                   config.num_warps, config.num_stages, config.split_k,
                                   config.max_block_m)
    return parts, scale, x_scale


def choice(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
           norm_weight: torch.Tensor, eps: float, quant: bool):
    """The parts-out config for the pair (the layer's GEMM of x, the residual-add norm after
    it; quant: the norm also writes its output in E4M3) where it measured faster, else None
    (gemm_timing.chosen_once: measured at the first call outside a CUDA graph capture)."""
    key = (triton.next_power_of_2(x.shape[0]), tuple(weight.shape), weight.stride(0),
           weight.dtype, x.dtype, x.device, quant)
    return gemm_timing.chosen_once(
        _choices, key, lambda: _measure(x, weight, scale, norm_weight, eps, quant))


def _measure(x, weight, scale, norm_weight, eps, quant):
    return gemm_timing.steady_choice(
        timings_ms(x, weight, scale, norm_weight, eps, quant), MARGIN,
        f"split parts + norm, {x.shape[0]} rows x {tuple(weight.shape)}", label)


def timings_ms(x, weight, scale, norm_weight, eps, quant) -> dict[Hashable, float]:
    """Median ms per (GEMM, norm) pair: the layer's GEMM and the plain norm (None) and each
    candidate's parts and summing norm, replayed over copies of the weight in the chain."""
    weights = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x)
    residual = torch.randn(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    plain_norm = rmsnorm.rms_norm_fp8 if quant else rmsnorm.add_rms_norm

    def reference(i):
        y = (dense_gemm.linear(xin, weights[i], None) if scale is None
             else fp8_gemm.linear(xin, weights[i], scale, None))
        return plain_norm(y, residual, norm_weight, eps)

    def summed(i, config):
        return parts_add_rms_norm(*parts_of(xin, weights[i], scale, config), residual,
                                  norm_weight, eps, quant)

    reference(0)  # the layer's GEMM chooses its config first, outside the timing graphs
    configs = DENSE_CONFIGS if scale is None else FP8_CONFIGS
    runs = {None: reference}
    runs.update({c: lambda i, c=c: summed(i, c) for c in configs})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"rows": key[0], "weight": list(key[1]), "quant": key[6], "kernel": label(config)}
            for key, config in _choices.items()]


def label(config) -> str:
    if config is None:
        return "the layer's GEMM + norm"
    if isinstance(config, fp8_gemm.Config):
        return f"parts {fp8_gemm._label(config)}"
    return f"parts {dense_gemm.label(config)}"
