"""y = silu_and_mul(x) W^T + b at one to four rows in one kernel: the GEMV (fp8_gemv.py,
GATED) reads x's [gate | up] and forms silu(gate) * up for its K slice in registers, rounded
to x's dtype as silu_mul.silu_and_mul rounds it, so its output is the same bits as that
kernel's followed by the same GEMV config. It saves the SiLU-and-mul launch (and its
intermediate's write and read) before a down projection at decode; it costs each program
the SiLU of every K it reads (recomputed by each column tile, so wide tiles or split K pay
less). A shape takes it only where it measured faster than SiLU-and-mul followed by the
GEMM its dispatch chose (`choice`), timed as that dispatch times (gemm_timing.py), FP8
weights (scale per row) and 16-bit ones (a scale of ones) alike."""
import logging

import torch

from parashift.kernels import fp8_gemm, fp8_gemv, gemm_timing, silu_mul, skinny_gemm

logger = logging.getLogger(__name__)

MAX_ROWS = fp8_gemv.MAX_ROWS
# beside the GEMV's own configs: wider column tiles (each program's SiLU serves more weight
# rows: ~30 instructions an element against the GEMV's ~2.5, so at 8 rows a tile an FP8 GEMV
# would issue ~0.8 of the SMs' instructions a clock where the unfused one issues ~0.3), split K
# by tickets for the programs
WIDE_CONFIGS = tuple(fp8_gemm.Config("gemv", n, 1024, 4, 1, split, tickets=split > 1)
                     for n, split in ((16, 1), (16, 2), (16, 4), (32, 4), (32, 8)))
_choices: dict[tuple, object] = {}


def args(config) -> tuple:
    """fp8_gemv's tile arguments of an FP8 GEMV Config or a skinny GemvConfig."""
    return (config.block_n, config.block_k, config.num_warps, getattr(config, "num_stages", 1),
            config.split_k, config.ahead, config.tickets)


def candidates(weight: torch.Tensor) -> list:
    """The GEMV configs measured for the fused kernel on this weight."""
    configs = fp8_gemm.GEMV_CONFIGS if weight.dtype == fp8_gemm.FP8 else skinny_gemm.GEMV_CONFIGS
    return [c for c in (*configs, *WIDE_CONFIGS) if c.block_n <= max(weight.shape[0], 1)]


def gated_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                 bias: torch.Tensor | None, config) -> torch.Tensor:
    """x [M <= 4, 2 K] ([gate | up]), weight [N, K] (E4M3 with scale [N, 1], or 16-bit with
    scale None): silu_and_mul(x) W^T (* scale) + bias in one GEMV of `config`."""
    if scale is None:
        scale = skinny_gemm.unit_scale(weight.shape[0], x.device)
    return fp8_gemv.fp8_gemv(x, weight, scale, bias, *args(config), gated=True)


def unfused_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """What the layers run without the fusion: SiLU-and-mul, then the GEMM dispatch."""
    h = silu_mul.silu_and_mul(x)
    if scale is None:
        return skinny_gemm.linear(h, weight, bias)
    return fp8_gemm.linear(h, weight, scale, bias)


def _key(x: torch.Tensor, weight: torch.Tensor, has_bias: bool) -> tuple:
    return (x.shape[0], tuple(weight.shape), weight.stride(0), weight.dtype, x.dtype,
            x.device, has_bias)


def choice(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
           bias: torch.Tensor | None):
    """The fused GEMV config for x [M, 2 K] on this weight where it measured faster than
    `unfused_linear`, else None. Measured on the shape's first call outside a CUDA graph
    capture; during a capture an unmeasured shape takes None."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or weight.stride(1) != 1:
        return None
    key = _key(x, weight, bias is not None)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return None
        unfused_linear(x, weight, scale, bias)  # the dispatch's own choice made first
        with gemm_timing.timing_launches():
            timings = timings_ms(x, weight, scale, bias)
        _choices[key] = skinny_gemm.choose(timings)
        logger.info("SiLU-and-mul in the GEMV, %d rows x %s: %s (%.2f µs; unfused %.2f µs)",
                    x.shape[0], tuple(weight.shape), _choices[key] or "unfused",
                    1e3 * timings[_choices[key]], 1e3 * timings[None])
    return _choices[key]


def timings_ms(x, weight, scale, bias) -> dict:
    """Milliseconds per call of `unfused_linear` (None) and of each fused config, replayed
    from CUDA graphs over copies of the weight (gemm_timing)."""
    weights = gemm_timing.weight_copies(weight)
    xin, chain = gemm_timing.timed_input(x)
    runs = {None: lambda i: unfused_linear(xin, weights[i], scale, bias)}
    runs.update({c: lambda i, c=c: gated_linear(xin, weights[i], scale, bias, c)
                 for c in candidates(weight)})
    return gemm_timing.replayed_timings_ms(runs, len(weights), chain)


def chosen() -> list[dict]:
    """What `choice` chose for each shape measured in this process."""
    return [{"rows": key[0], "weight": list(key[1]), "kernel": "unfused" if config is None
             else f"gated gemv {'x'.join(map(str, args(config)[:2]))} split {config.split_k}"
             f"{' ahead' if config.ahead else ''}{' tickets' if config.tickets else ''}"}
            for key, config in _choices.items()]
