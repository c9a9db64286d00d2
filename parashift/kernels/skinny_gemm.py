"""y = x W^T + b for a few rows of x (decode at batch 1 to 4), streaming W once.

At one to four rows a linear layer is a weight read: cuBLAS tiles small projections
(the 8B shape's qkv and o) into too few CTAs to keep the H200's memory busy, and splits
K for others, which costs a reduction kernel. Here each program owns BLOCK_N output
columns over all of K, so there is no reduction, and a shape gets this kernel only where
it measured faster than cuBLAS on the device (`linear`). Beside its tl.dot configs, GEMV
configs (kernels/fp8_gemv.py's kernel with a scale of ones) are measured too."""
import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from parashift.engine_switches import switch
from parashift.kernels import fp8_gemv, gemm_timing, pdl

logger = logging.getLogger(__name__)

MAX_ROWS = 4
# PARASHIFT_SKINNY_GEMM=0 keeps every shape on cuBLAS (for before/after measurements).
ENABLED = switch("PARASHIFT_SKINNY_GEMM", "1")
# Triton must beat cuBLAS by this factor to be chosen: timings of a few µs are noisy.
MARGIN = 0.97


@dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


CONFIGS = (Config(16, 512, 4, 3), Config(32, 256, 4, 4), Config(32, 512, 4, 3),
           Config(64, 256, 4, 3), Config(64, 128, 4, 4), Config(128, 128, 8, 3))


@dataclass(frozen=True)
class GemvConfig:
    """kernels/fp8_gemv.py's GEMV on 16-bit weights (a scale of ones): no 16-row tl.dot, one
    accumulator per row; split_k > 1 sums parts of K atomically into fp32."""
    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1
    ahead: bool = False  # the next weight tile's load in flight (fp8_gemv.py's AHEAD)
    tickets: bool = False  # split_k's parts summed by each tile's last program


# the small projections (Qwen3-30B-A3B's qkv [5120, 2048] and o [2048, 4096]) took cuBLAS
# over every Config at 1-4 rows on an H200; narrow column tiles over all of K give them the
# programs (no spills on sm_90 at 1 and 4 rows, ptxas: 32-173 registers)
GEMV_CONFIGS = (GemvConfig(2, 1024, 4), GemvConfig(4, 1024, 4), GemvConfig(2, 2048, 4),
                GemvConfig(4, 2048, 4), GemvConfig(8, 1024, 4), GemvConfig(2, 4096, 8),
                GemvConfig(4, 1024, 4, 2), GemvConfig(8, 1024, 4, 2),
                GemvConfig(4, 1024, 4, ahead=True), GemvConfig(2, 2048, 4, ahead=True),
                GemvConfig(8, 1024, 4, ahead=True), GemvConfig(4, 1024, 4, 2, ahead=True),
                GemvConfig(4, 1024, 4, 2, tickets=True), GemvConfig(8, 1024, 4, 2, tickets=True))
# PARASHIFT_SKINNY_GEMV=0 measures the tl.dot configs only (for before/after measurements)
MEASURED = CONFIGS + (GEMV_CONFIGS if switch("PARASHIFT_SKINNY_GEMV", "1") else ())


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
                   PREFETCH_K: tl.constexpr):
    first_n = tl.program_id(0) * BLOCK_N
    pdl.start_streaming(w_ptr, stride_wn, N, K, first_n, 0, BLOCK_N, PREFETCH_K, USE_PDL)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k[None, :] < K), other=0.0)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    pdl.inputs_read(USE_PDL)
    y = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  config: Config | GemvConfig) -> torch.Tensor:
    """x [M <= MAX_ROWS, K], weight [N, K] with unit stride along K (row slices of a
    larger weight are fine), bias [N] or None."""
    if x.dim() != 2 or x.shape[0] > MAX_ROWS:
        raise ValueError(f"skinny_linear takes 2-D x of at most {MAX_ROWS} rows, "
                         f"got {tuple(x.shape)}")
    if weight.stride(1) != 1:
        raise ValueError("skinny_linear needs the weight's last dimension contiguous")
    if isinstance(config, GemvConfig):
        return fp8_gemv.fp8_gemv(x, weight, unit_scale(weight.shape[0], x.device), bias,
                                 config.block_n, config.block_k, config.num_warps, 1,
                                 config.split_k, config.ahead, config.tickets)
    x = x if x.stride(1) == 1 else x.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, config.block_n),)](
        x, weight, bias if bias is not None else weight, y, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32, BLOCK_M=16, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl.launch_options(x.device, (config.block_n, k, weight.element_size())))
    return y


_choices: dict[tuple, Config | GemvConfig | None] = {}
_unit_scales: dict[tuple, torch.Tensor] = {}


def unit_scale(n: int, device: torch.device) -> torch.Tensor:
    """n fp32 ones, made once per (n, device): at the shape's measurement, outside a CUDA
    graph capture, so a captured GEMV reads a tensor that outlives the graph."""
    key = (n, device)
    if key not in _unit_scales:
        _unit_scales[key] = torch.ones(n, dtype=torch.float32, device=device)
    return _unit_scales[key]


def _key(rows: int, weight: torch.Tensor, dtype: torch.dtype, device: torch.device,
         has_bias: bool) -> tuple:
    return (rows, tuple(weight.shape), weight.stride(0), dtype, device, has_bias)


def measured_choice(rows: int, weight: torch.Tensor, dtype: torch.dtype,
                    device: torch.device, has_bias: bool) -> Config | GemvConfig | None:
    """`linear`'s choice for this shape where measured (None: cuBLAS or not measured)."""
    return _choices.get(_key(rows, weight, dtype, device, has_bias))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear on CUDA, or the skinny kernel for the shapes where it measured faster.
    A shape is measured on its first call outside a CUDA graph capture (the graphs'
    warm-up runs come first); during a capture an unmeasured shape takes cuBLAS."""
    if not ENABLED or x.dim() != 2 or x.shape[0] > MAX_ROWS:
        return F.linear(x, weight, bias)
    key = _key(x.shape[0], weight, x.dtype, x.device, bias is not None)
    config = gemm_timing.chosen_once(_choices, key, lambda: _measure(x, weight, bias))
    return F.linear(x, weight, bias) if config is None else skinny_linear(x, weight, bias, config)


def _measure(x, weight, bias) -> Config | GemvConfig | None:
    return gemm_timing.steady_choice(
        timings_ms(x, weight, bias), MARGIN,
        f"skinny GEMM, {x.shape[0]} rows x {tuple(weight.shape)}", label)


def chosen() -> list[dict]:
    """What `linear` chose for each shape measured in this process."""
    return [{"rows": key[0], "weight": list(key[1]), "kernel": label(config)}
            for key, config in _choices.items()]


def label(config: Config | GemvConfig | None) -> str:
    if config is None:
        return "cuBLAS"
    if isinstance(config, GemvConfig):
        return (f"gemv {config.block_n}x{config.block_k} split {config.split_k}"
                f"{' ahead' if config.ahead else ''}{' tickets' if config.tickets else ''}")
    return f"skinny {config.block_n}x{config.block_k}"


def measured(n: int) -> list[Config | GemvConfig]:
    """The configs timed against cuBLAS for an N-row weight."""
    return [c for c in MEASURED if c.block_n <= triton.next_power_of_2(n)]


def timings_ms(x, weight, bias) -> dict[Config | GemvConfig | None, float]:
    """Median milliseconds per call of cuBLAS (None) and of each config, replayed from CUDA
    graphs over copies of the weight (`gemm_timing`: in the decode chain where
    PARASHIFT_GEMM_TIMING asks), or with L2 flushed between calls where it asks for that or
    a graph cannot be captured (the median: a mean of a few-µs kernel moves with a stray slow
    call). A config this device cannot compile or run (resources) is left out, not fatal."""
    if not gemm_timing.flushed():
        try:
            timings = chained_timings_ms(x, weight, bias)
            if None in timings:
                return timings
        except Exception as exc:  # noqa: BLE001  graphs not capturable here: flush instead
            logger.warning("skinny GEMM timing in CUDA graphs failed (%s); flushing L2", exc)
    bench = functools.partial(triton.testing.do_bench, warmup=5, rep=30, return_mode="median")
    timings = {None: bench(lambda: F.linear(x, weight, bias))}
    for config in measured(weight.shape[0]):
        try:
            timings[config] = bench(lambda c=config: skinny_linear(x, weight, bias, c))
        except Exception as exc:  # noqa: BLE001  Triton's compile and launch errors
            logger.warning("skinny GEMM config %s failed on %s: %s", config,
                           tuple(weight.shape), exc)
    return timings


def chained_timings_ms(x, weight, bias) -> dict[Config | GemvConfig | None, float]:
    """`timings_ms` replayed from CUDA graphs over copies of the weight, in the chain each
    call after a kernel writing its input (gemm_timing's)."""
    return gemm_timing.against_library_ms(x, weight, bias, skinny_linear,
                                          measured(weight.shape[0]))
