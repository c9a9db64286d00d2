"""The RMSNorm before a linear layer (with the residual add) computed inside that layer's GEMV
at one row (FUSED_ROWS; the kernel serves one to four: decode, issue 61), FP8 weights (scale
per row) and 16-bit ones (a scale of ones) alike: each program of fp8_gemv.py's kernel (NORM)
reads the rows x and residual, takes their 1 / rms, and forms rms_norm(x + residual) of each K
slice it multiplies; its first program stores the new residual x + residual. The norm's
launch goes away; every program reads the rows from L2 (twice: the sum of squares, then the
slices) and normalises its K slices, work that does not shrink with the weight's bytes (on an
H200 the fused FP8 GEMV ran 10-14% slower than the plain one, bf16's 2-8%).

The output is the unfused pair's (`rmsnorm.add_rms_norm` then the GEMV) except for 1 / rms,
whose sum of squares runs in the GEMV's layout (norm_values.py): its last bits may differ,
and with them a rounded normalised value now and then; and the GEMV's config may differ from
the dispatch's (another order of its sums). gate_up's SiLU-and-mul may come in the same
GEMV's epilogue (gated_gemv.py's "gate_up": `silu` below).

A shape takes the fusion only where it timed faster than the unfused pair as the layers run
it (the norm kernel, then the dispatch's GEMM or SiLU GEMV; `choice`), in the decode chain
(gemm_timing.py's, PDL on)."""
from dataclasses import dataclass
from typing import Callable

import torch

from parashift.kernels import fp8_gemm, fp8_gemv, gated_gemv, gemm_timing, rmsnorm, skinny_gemm

MAX_ROWS = fp8_gemv.MAX_ROWS
# rows up to which `choice` measures the fusion (the kernel serves MAX_ROWS): each count and
# shape is timed at start-up over every candidate, compiled for it
FUSED_ROWS = 1


@dataclass(frozen=True)
class Config:
    """fp8_gemv's GEMV with the norm's input, one part of K (every part would take the whole
    row's 1 / rms); ahead as fp8_gemv.py's AHEAD."""
    block_n: int
    block_k: int
    num_warps: int
    ahead: bool = False


# (block_n, block_k, warps): each program reads three K-wide rows (x, residual, the norm's
# weight) and the first two twice; 32 to 64 fp32 weight values a thread. On an H200 (one row,
# the 8B's QKV and gate_up) 8x1024 and 8x2048 w8 were the fastest; 16x1024 and 32x512 at 8
# warps, 32x256 and 2x2048 at 4 lost by 20-80%, and each program prefetching its weight rows
# into L2 before its 1 / rms lost 10-40% everywhere
CONFIGS = (Config(4, 1024, 4), Config(8, 1024, 4), Config(8, 2048, 8), Config(16, 512, 4),
           Config(8, 1024, 4, ahead=True))
_choices: dict[tuple, object] = {}


def candidates(weight: torch.Tensor) -> list[Config]:
    """The configs measured on this weight (even block_n: SiLU's gate and up pairs fit)."""
    return [c for c in CONFIGS if c.block_n <= max(weight.shape[0], 2)]


def fused_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                 eps: float, weight: torch.Tensor, scale: torch.Tensor | None,
                 bias: torch.Tensor | None, config, silu: bool = False,
                 new_residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) W^T + b, x + residual) by one GEMV of `config` (x where no
    residual; written to new_residual where given); silu: silu_and_mul of the product (W
    holds [gate; up]). W in E4M3 with scale [rows, 1], or 16-bit with scale None."""
    if scale is None:
        scale = skinny_gemm.unit_scale(weight.shape[0], x.device)
    if residual is None:
        new_residual = x
    elif new_residual is None:
        new_residual = torch.empty_like(x)
    y = fp8_gemv.fp8_gemv(x, weight, scale, bias, config.block_n, config.block_k,
                          config.num_warps, 1, ahead=config.ahead, silu_out=silu,
                          norm=fp8_gemv.NormInput(residual, norm_weight, eps, new_residual))
    return y, new_residual


def unfused_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                   eps: float, weight: torch.Tensor, scale: torch.Tensor | None,
                   bias: torch.Tensor | None, silu_config=None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """What the layers run without the fusion: the norm kernel, then the dispatch's GEMM (or,
    given silu_config, gated_gemv's SiLU GEMV of that config); where the FP8 dispatch
    quantizes its input per token, the norm kernel writes the E4M3 rows too
    (layers/fp8_input.py's twin)."""
    if silu_config is not None:
        normed, new_residual = _norm(x, residual, norm_weight, eps)
        return gated_gemv.fused_linear("gate_up", normed, weight, scale, bias,
                                       silu_config), new_residual
    if scale is not None and fp8_gemm.quantizes_activations(x.shape[0], weight, x.dtype,
                                                            x.device, bias is not None):
        normed, new_residual, rows, scales = rmsnorm.rms_norm_fp8(x, residual, norm_weight, eps)
        return fp8_gemm.linear(normed, weight, scale, bias, (rows, scales)), new_residual
    normed, new_residual = _norm(x, residual, norm_weight, eps)
    return gated_gemv.dispatched_linear(normed, weight, scale, bias), new_residual


def _norm(x, residual, norm_weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    if residual is None:
        return rmsnorm.rms_norm(x, norm_weight, eps), x
    return rmsnorm.add_rms_norm(x, residual, norm_weight, eps)


def _key(x, residual, norm_weight, weight, has_bias, silu_config) -> tuple:
    return (x.shape[0], tuple(weight.shape), weight.stride(0), weight.dtype, x.dtype, x.device,
            residual is not None, has_bias, silu_config)


def fusable(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
            weight: torch.Tensor) -> bool:
    """Whether the fused GEMV is measured for these tensors: 1 to FUSED_ROWS rows of K in
    the norm weight's dtype (a residual alike), a weight [N, K] contiguous along K."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= FUSED_ROWS and weight.dim() == 2
            and weight.stride(1) == 1 and weight.shape[1] == x.shape[1]
            and norm_weight.shape == (x.shape[1],) and norm_weight.dtype == x.dtype
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype)))


def choice(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
           eps: float, weight: torch.Tensor, scale: torch.Tensor | None,
           bias: torch.Tensor | None, silu_config=None):
    """The config of the fused GEMV for these tensors where it measured faster than
    `unfused_linear`, else None. Measured on the shape's first call outside a CUDA graph
    capture; during a capture an unmeasured shape takes None."""
    if not fusable(x, residual, norm_weight, weight):
        return None
    key = _key(x, residual, norm_weight, weight, bias is not None, silu_config)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return None
        unfused_linear(x, residual, norm_weight, eps, weight, scale, bias,
                       silu_config)  # the dispatch's own choice made first
        with gemm_timing.timing_launches(chain=True):
            timings = timings_ms(x, residual, norm_weight, eps, weight, scale, bias,
                                 silu_config, candidates(weight))
        _choices[key] = gemm_timing.steady_choice(
            timings, skinny_gemm.MARGIN, f"RMSNorm in the GEMV, {x.shape[0]} rows x "
            f"{tuple(weight.shape)}{' with SiLU' if silu_config else ''}", label)
    return _choices[key]


def timings_ms(x, residual, norm_weight, eps, weight, scale, bias, silu_config,
               configs) -> dict:
    """Milliseconds per call of `unfused_linear` (None) and of each fused config, replayed
    from CUDA graphs over copies of the weight, each call after a kernel writing its input
    (gemm_timing's chain, whatever PARASHIFT_GEMM_TIMING says: the fusion saves a launch
    boundary, which PDL, as the engine launches, makes cheaper; timed with PDL suspended, the
    unfused pair paid a whole one and a fused GEMV that lost in the decode chain was chosen)."""
    weights = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x, chain=True)
    silu = silu_config is not None
    runs: dict[object, Callable[[int], object]] = {
        None: lambda i: unfused_linear(xin, residual, norm_weight, eps, weights[i], scale,
                                       bias, silu_config)}
    runs.update({c: lambda i, c=c: fused_linear(xin, residual, norm_weight, eps, weights[i],
                                                scale, bias, c, silu)
                 for c in configs})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"rows": key[0], "weight": list(key[1]), "residual": key[6],
             "silu": key[8] is not None,
             "kernel": label(config)}
            for key, config in _choices.items()]


def label(config: Config | None) -> str:
    if config is None:
        return "unfused"
    return (f"gemv {config.block_n}x{config.block_k} w{config.num_warps}"
            f"{' ahead' if config.ahead else ''}")
