"""Whether FP8 gate_up forms SiLU-and-mul in its epilogue at 5-64 rows (fp8_gated_tma.py,
then the product's rows quantized for down by `fp8_gemm.quantize_rows`), against the pair
the layers run otherwise: the GEMM `fp8_gemm.linear` chose, then
`silu_mul.silu_and_mul_fp8`. Both give the same bits where the fused tiling sums K as the
dispatch's choice does (a TMA E4M3 x E4M3 config of one part of K: the same K step and
tokens a tile), so only such tilings are candidates, and none where the dispatch chose
another kernel. Timed at the shape's row bucket's first call outside a CUDA graph capture
(gemm_timing.py's chain, `steady_choice`); during a capture an unmeasured shape takes the
pair."""
from dataclasses import dataclass
from typing import Callable

import torch

from parashift.kernels import fp8_gated_tma, fp8_gemm, fp8_gemm_tma, fp8_gemv, gemm_timing, \
    silu_mul, skinny_gemm
from parashift.kernels.gated_tma import GatedTiling

MIN_ROWS, MAX_ROWS = fp8_gemv.MAX_ROWS + 1, fp8_gemm.MAX_ROWS
MARGIN = skinny_gemm.MARGIN  # the fusion must beat the pair by this factor to be chosen


@dataclass(frozen=True)
class Tiling(GatedTiling):
    max_block_m: int = 0  # the dispatch's config's (fp8_gemm.Config.max_block_m)
    # down's E4M3 rows by fp8_gated_tma.quantize_by_parts from the tiles' largest magnitudes
    # (else fp8_gemm.quantize_rows, a program a row finding the largest itself)
    by_parts: bool = False


# (gate rows, K step, warps, stages): fp8q's benchmark tilings (benchmarks/fp8_tma_anatomy.py:
# 128x128 w8 s4 on the dispatch's 256x128 grid at 64 rows, 34.24 µs with the product against
# 33.39 without) and more of the dispatch's other K step (256). Each warpgroup takes 64 gate
# rows (and 64 up rows): the E4M3 wgmma the dispatch's TMA kernel issues (sm_90 PTX; at 32
# rows a warpgroup Triton issues mma.sync instead, other sums)
TILINGS = ((128, 128, 8, 4), (128, 128, 8, 3), (64, 128, 4, 4), (64, 256, 4, 3),
           (64, 256, 4, 4), (128, 256, 8, 2))
_choices: dict[tuple, Tiling | None] = {}


def candidates(unfused) -> list[Tiling]:
    """The tilings whose sums are the dispatch's config `unfused` bit for bit."""
    if not isinstance(unfused, fp8_gemm.Config) or unfused.kernel != "tma_w8a8" \
            or unfused.split_k != 1:
        return []
    return [Tiling(*t, max_block_m=unfused.max_block_m, by_parts=by_parts)
            for by_parts in (False, True) for t in TILINGS if t[1] == unfused.block_k]


def fused(x_fp8: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor, scale: torch.Tensor,
          out_dtype: torch.dtype, tiling: Tiling
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(silu_and_mul(x W^T) [M, HALF], its rows in E4M3, their fp32 scales [M, 1]) of x's
    E4M3 rows and scales `x_fp8`, the [gate; up] weight W (scale per row) on `tiling`."""
    made = fp8_gated_tma.gated_linear(*x_fp8, weight, scale, out_dtype, tiling.block_n,
                                      tiling.block_k, tiling.num_warps, tiling.num_stages,
                                      tiling.max_block_m, tiling.by_parts)
    if tiling.by_parts:
        return (made[0], *fp8_gated_tma.quantize_by_parts(*made))
    return (made, *fp8_gemm.quantize_rows(made))


def unfused(x: torch.Tensor, x_fp8: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor,
            scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the layers run without the fusion: the GEMM, then SiLU-and-mul with FP8 rows."""
    return silu_mul.silu_and_mul_fp8(fp8_gemm.linear(x, weight, scale, None, x_fp8))


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """MIN_ROWS to MAX_ROWS rows, a [gate; up] E4M3 weight without a bias that TMA reads."""
    return (x.dim() == 2 and MIN_ROWS <= x.shape[0] <= MAX_ROWS and bias is None
            and weight.dtype == fp8_gemm.FP8 and weight.shape[0] % 2 == 0
            and fp8_gemm_tma.takes(weight))


def _key(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    return (fp8_gemm.row_bucket(x.shape[0]), tuple(weight.shape), weight.stride(0), x.dtype,
            x.device)


def choice(x: torch.Tensor, x_fp8: tuple[torch.Tensor, torch.Tensor], weight: torch.Tensor,
           scale: torch.Tensor, bias: torch.Tensor | None) -> Tiling | None:
    """The fused tiling for x (its E4M3 rows x_fp8) on this gate_up weight where it timed
    faster than `unfused`, else None."""
    if not takes(x, weight, bias):
        return None
    key = _key(x, weight)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return None
        unfused(x, x_fp8, weight, scale)  # the dispatch's own choice made first
        configs = candidates(fp8_gemm.measured_choice(x.shape[0], weight, x.dtype, x.device,
                                                      False))
        if not configs:
            _choices[key] = None
            return None
        with gemm_timing.timing_launches():
            timings = timings_ms(x, x_fp8, weight, scale, configs)
        _choices[key] = gemm_timing.steady_choice(
            timings, MARGIN, f"SiLU-and-mul in FP8 gate_up's epilogue, "
            f"{x.shape[0]} rows x {tuple(weight.shape)}", label)
    return _choices[key]


def timings_ms(x, x_fp8, weight, scale, configs) -> dict:
    """Milliseconds per call of `unfused` (None) and of `fused` on each tiling, replayed from
    CUDA graphs over copies of the weight, each call after a kernel writing its E4M3 rows
    where PARASHIFT_GEMM_TIMING asks for the chain (gemm_timing)."""
    weights = gemm_timing.weight_copies(weight)
    rows, chain = gemm_timing.timed_input(x_fp8[0])
    rows_fp8 = (rows, x_fp8[1])
    runs: dict[object, Callable[[int], object]] = {
        None: lambda i: unfused(x, rows_fp8, weights[i], scale)}
    runs.update({t: lambda i, t=t: fused(rows_fp8, weights[i], scale, x.dtype, t)
                 for t in configs})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def label(tiling: Tiling | None) -> str:
    if tiling is None:
        return "unfused"
    return (f"gated {tiling.block_n}x{tiling.block_k} w{tiling.num_warps} "
            f"s{tiling.num_stages}{f' m<={tiling.max_block_m}' if tiling.max_block_m else ''}"
            f"{' by parts' if tiling.by_parts else ''}")


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"rows_up_to": key[0], "weight": list(key[1]), "kernel": label(tiling)}
            for key, tiling in _choices.items()]
