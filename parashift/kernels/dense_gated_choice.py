"""Whether 16-bit gate_up forms SiLU-and-mul in its epilogue at 33-64 rows
(dense_gated_tma.py), against the pair the layers run otherwise: the GEMM `dense_gemm.linear`
chose, then `silu_mul.silu_and_mul`. Both give the same bits where the fused tiling sums K
as the dispatch's choice does (a TMA config of one part of K: the same K step and tokens a
tile, 64 weight rows a warpgroup), so only such tilings are candidates, and none where the
dispatch chose cuBLAS or a K split. Timed at the shape's row bucket's first call outside a
CUDA graph capture (gemm_timing.py's chain, `steady_choice`); during a capture an
unmeasured shape takes the pair."""
from dataclasses import dataclass
from typing import Callable

import torch

from parashift.kernels import dense_gated_tma, dense_gemm, dense_gemm_tma, gemm_timing, silu_mul
from parashift.kernels.gated_tma import GatedTiling

MIN_ROWS, MAX_ROWS = dense_gemm.MIN_ROWS, dense_gemm.MAX_ROWS
MARGIN = dense_gemm.MARGIN  # the fusion must beat the pair by this factor to be chosen


@dataclass(frozen=True)
class Tiling(GatedTiling):
    block_m: int = 64  # tokens a program: the dispatch's config's


# (gate rows, K step, warps, stages) for each K step of dense_gemm.CONFIGS; shared memory a
# stage is 2 (2 gate rows + 64 tokens) K step bytes, at most ~200 KB, or ~96 KB for two
# programs an SM (the 8B's gate_up at 64 gate rows: 224 programs on 132 SMs). Each warpgroup
# takes 64 gate rows (and 64 up rows): the wgmma the dispatch's kernel issues
TILINGS = ((64, 128, 4, 4), (64, 128, 4, 2), (128, 128, 8, 2), (64, 64, 4, 8), (64, 64, 4, 4),
           (128, 64, 8, 4), (64, 256, 4, 2))
_choices: dict[tuple, Tiling | None] = {}


def candidates(unfused) -> list[Tiling]:
    """The tilings whose sums are the dispatch's config `unfused` bit for bit."""
    if not isinstance(unfused, dense_gemm.Config) or unfused.split_k != 1:
        return []
    return [Tiling(*t, block_m=unfused.block_m) for t in TILINGS if t[1] == unfused.block_k]


def fused(x: torch.Tensor, weight: torch.Tensor, tiling: Tiling) -> torch.Tensor:
    """silu_and_mul(x W^T) [M, HALF] of the [gate; up] weight W on `tiling`."""
    return dense_gated_tma.gated_linear(x, weight, tiling.block_n, tiling.block_m,
                                        tiling.block_k, tiling.num_warps, tiling.num_stages)


def unfused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the layers run without the fusion: the GEMM, then SiLU-and-mul."""
    return silu_mul.silu_and_mul(dense_gemm.linear(x, weight, None))


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """MIN_ROWS to MAX_ROWS rows of a 16-bit x, a [gate; up] weight of its dtype without a
    bias that TMA reads, the dense TMA GEMM on (PARASHIFT_DENSE_TMA)."""
    return (dense_gemm.handles(x) and bias is None and weight.dtype == x.dtype
            and weight.shape[0] % 2 == 0 and dense_gemm.enabled()
            and dense_gemm_tma.takes(weight))


def choice(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Tiling | None:
    """The fused tiling for x on this gate_up weight where it timed faster than `unfused`,
    else None."""
    if not takes(x, weight, bias):
        return None
    key = (dense_gemm.row_bucket(x.shape[0]), tuple(weight.shape), weight.stride(0), x.dtype,
           x.device)
    return gemm_timing.chosen_once(_choices, key, lambda: _measure(x, weight))


def _measure(x: torch.Tensor, weight: torch.Tensor) -> Tiling | None:
    unfused(x, weight)  # the dispatch's own choice made first
    configs = candidates(dense_gemm.measured_choice(x.shape[0], weight, x.dtype, x.device,
                                                    False))
    if not configs:
        return None
    return gemm_timing.steady_choice(
        timings_ms(x, weight, configs), MARGIN, f"SiLU-and-mul in gate_up's epilogue, "
        f"{x.shape[0]} rows x {tuple(weight.shape)}", label)


def timings_ms(x: torch.Tensor, weight: torch.Tensor, configs) -> gemm_timing.Timings:
    """Milliseconds per call of `unfused` (None) and of `fused` on each tiling, replayed from
    CUDA graphs over copies of the weight, each call after a kernel writing its input where
    PARASHIFT_GEMM_TIMING asks for the chain (gemm_timing)."""
    weights = gemm_timing.weight_copies(weight)
    rows, chain = gemm_timing.timed_input(x)
    runs: dict[object, Callable[[int], object]] = {None: lambda i: unfused(rows, weights[i])}
    runs.update({t: lambda i, t=t: fused(rows, weights[i], t) for t in configs})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def label(tiling: Tiling | None) -> str:
    if tiling is None:
        return "unfused"
    return (f"gated {tiling.block_n}x{tiling.block_m}x{tiling.block_k} w{tiling.num_warps} "
            f"s{tiling.num_stages}")


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"rows_up_to": key[0], "weight": list(key[1]), "kernel": label(tiling)}
            for key, tiling in _choices.items()]
