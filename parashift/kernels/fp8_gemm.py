"""y = x (W * s)^T + b with W in FP8 E4M3 and one scale per output row, on CUDA.

Decode reads the weight and little else, so at up to MAX_ROWS rows a Triton kernel reads
the FP8 bytes, widens them to the activations' dtype in registers and multiplies with the
activations as they are (no per-token quantization kernel); at one to four rows a GEMV
(`fp8_gemv.py`) does the same without a 16-row tl.dot. cuBLASLt's FP8 GEMM
(`torch._scaled_mm`, rowwise scales, activations quantized per token) measured no faster
than bf16 at 1-64 rows on an H200 (issue 60) and wins above. A shape takes whichever
measured faster on the device (`gemm_timing.py`), like `skinny_gemm.linear`."""
import logging
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from parashift.engine_switches import switch
from parashift.kernels import fp8_gemm_tma, fp8_gemv, gemm_timing, pdl, split_tickets
from parashift.kernels.fp8_epilogue import early_scales, finish_split_tile, tile_scales
from parashift.kernels.skinny_gemm import MARGIN

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
MAX_ROWS = 64
FAST_ACCUM_ENV = "PARASHIFT_FP8_FAST_ACCUM"


@dataclass(frozen=True)
class Config:
    kernel: str
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # programs per output tile, each over a part of K, summed atomically
    ahead: bool = False  # "gemv": the next weight tile's load in flight (fp8_gemv.py)
    tickets: bool = False  # split_k > 1: the parts summed by the tile's last program
    # the TMA kernels: the most tokens a tile takes (0: fp8_gemm_tma.block_m's); fewer gives
    # more programs at the cost of re-reading each weight tile (mostly from L2)
    max_block_m: int = 0


# (kernel, block_n, block_k, warps, stages): "w8" widens the FP8 weight to the activations'
# dtype; "w8a8" quantizes the activations per token (one kernel) and multiplies FP8 by FP8
CONFIGS = tuple(Config(kernel, *shape) for kernel in ("w8", "w8a8") for shape in (
    (16, 256, 4, 4), (32, 256, 4, 4), (32, 512, 4, 2), (64, 256, 4, 3), (64, 512, 8, 2),
    (128, 256, 8, 2), (32, 256, 4, 4, 2), (32, 256, 4, 4, 4), (64, 256, 4, 3, 2))) + tuple(
    # K split, the parts summed by each tile's last program (split_tickets.py): no zeroing
    # or cast kernel, so N = 4096 at 16-64 rows gets the programs cheaply, and wide column
    # tiles (each reads the rows' activations once a K step: 64 x 32 columns read twice the
    # activation bytes of weight bytes) keep enough of them; w8 (no per-token quantization
    # kernel before it) split so too
    Config("w8a8", *shape, tickets=True) for shape in (
        (32, 256, 4, 4, 2), (32, 256, 4, 4, 4), (64, 256, 4, 3, 2), (16, 256, 4, 4, 2),
        (64, 256, 4, 3, 4), (128, 256, 8, 2, 2), (128, 256, 8, 2, 4))) + (
    Config("w8", 32, 256, 4, 4, 2, tickets=True), Config("w8", 16, 256, 4, 4, 2, tickets=True))
# "tma_w8a8" (fp8_gemm_tma.py), above the GEMV's rows: the weight by TMA as wgmma's 64-256-row
# side (y^T = W x^T), E4M3 by E4M3; K split by tickets so that N = 4096 fills the SMs. The
# configs that won or came second at a shape of the 8B's at 16, 32 or 64 rows on an H200
# (docs/benchmark_log.md, benchmarks/fp8_gemm_sweep.py; the widening "tma_w8" kernels and the
# persistent one lost everywhere); measured where fp8_gemm_tma.enabled() (PARASHIFT_FP8_TMA,
# on by default)
TMA_CONFIGS = tuple(Config("tma_w8a8", *shape, tickets=True) for shape in (
    (64, 256, 4, 6, 1), (64, 256, 4, 5, 1), (64, 256, 4, 4, 1), (64, 256, 4, 5, 2),
    (64, 256, 4, 4, 2), (64, 256, 4, 4, 4), (256, 128, 8, 4, 1)))
# "gemv" (fp8_gemv.py), at most fp8_gemv.MAX_ROWS rows: BLOCK_K bytes of each of BLOCK_N
# weight rows a step, BLOCK_K >= 8 * 32 * warps (the tile's K spans every thread, so the loop
# needs no shuffles or shared memory: checked in sm_90 PTX); narrow BLOCK_N or split K where N
# gives too few programs for the SMs (split K by atomics costs a zeroing and a cast kernel,
# by tickets neither); then configs loading a tile ahead (the first before the PDL wait),
# around the shapes chosen at one row, and split by tickets. The order is the choice's
# preference among configs that time within its margin (gemm_timing.steady_choice): first the
# two the 8B's one-row projections took (8x1024 first: its gate_up start-up ran FP8 b1 at
# 2.540 ms a step where 4x2048's ran 2.590, docs/benchmark_log.md, session 47's last call)
GEMV_CONFIGS = tuple(Config("gemv", *shape) for shape in (
    (8, 1024, 4, 1), (4, 2048, 4, 1), (2, 2048, 4, 1), (4, 1024, 4, 1), (8, 2048, 8, 1),
    (2, 4096, 8, 1), (4, 2048, 4, 1, 2), (8, 1024, 4, 1, 2))) + tuple(
    Config("gemv", *shape, ahead=True) for shape in (
        (8, 1024, 4, 1), (4, 2048, 4, 1), (4, 1024, 4, 1), (2, 2048, 4, 1), (4, 1024, 4, 1, 2))
) + tuple(Config("gemv", *shape, tickets=True) for shape in (
    (4, 1024, 4, 1, 2), (8, 1024, 4, 1, 2), (4, 2048, 4, 1, 2))) + (
    Config("gemv", 4, 1024, 4, 1, 2, ahead=True, tickets=True),)


# A row's E4M3 values and scale: the kernels that write FP8 rows beside their output (the
# RMSNorm, SiLU-and-mul, gate_up's TMA epilogue) call these as _quantize_rows_kernel does, so
# their rows are its bit for bit.
@triton.jit
def row_scale(largest, FP8_MAX: tl.constexpr):
    """A row's scale from its largest magnitude (fp32)."""
    return tl.maximum(largest, 1e-12) / FP8_MAX


@triton.jit
def to_fp8(x, scale, q_ptrs, mask, FP8_MAX: tl.constexpr):
    """Stores x (fp32) / scale in E4M3 at q_ptrs."""
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm,
                          FP8_MAX: tl.constexpr, BLOCK_K: tl.constexpr,
                          USE_PDL: tl.constexpr):
    """One row per program: its scale (largest magnitude / FP8_MAX) and its E4M3 values."""
    pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
    pdl.inputs_read(USE_PDL)
    scale = row_scale(tl.max(tl.abs(x), axis=0), FP8_MAX)
    to_fp8(x, scale, q_ptr + row * stride_qm + k, k < K, FP8_MAX)
    tl.store(s_ptr + row, scale)


@triton.jit
def _fp8_weight_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, counter_ptr, M, N,
                       K, stride_xm, stride_wn, stride_ym, HAS_BIAS: tl.constexpr,
                       FP8_X: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, USE_PDL: tl.constexpr,
                       PREFETCH_K: tl.constexpr, TICKETS: tl.constexpr = False,
                       EARLY_SCALES: tl.constexpr = False):
    first_n = tl.program_id(0) * BLOCK_N
    split = tl.program_id(2)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    pdl.start_streaming(w_ptr, stride_wn, N, K, first_n, split * k_per_split, BLOCK_N,
                        PREFETCH_K, USE_PDL)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    if EARLY_SCALES:
        scales = tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, HAS_BIAS, FP8_X)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(K, (split + 1) * k_per_split)
    for k0 in range(split * k_per_split, k_end, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k[None, :] < K), other=0.0)
        if FP8_X:
            acc = tl.dot(x, tl.trans(w), acc)
        else:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    if not EARLY_SCALES:
        scales = tile_scales(xs_ptr, s_ptr, b_ptr, offs_m, offs_n, m_ok, n_ok, HAS_BIAS, FP8_X)
    finish_split_tile(acc, scales, y_ptr, part_ptr, counter_ptr, M, N, stride_ym,
                      offs_m, offs_n, m_ok, n_ok, split,
                      tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), HAS_BIAS,
                      FP8_X, SPLIT_K, TICKETS, USE_PDL)


def block_m(rows: int) -> int:
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def quantize_warps(k: int) -> int:
    """_quantize_rows_kernel's warps for rows of k: 8 from 8,192 (4,096 rows of 14,336 on an
    H200: 43.2 µs against 46.8 at 4 and 47.2 at 16; rows of 4,096 12.7 at 4 and 8)."""
    return 8 if k >= 8192 else 4


def quantize_rows(x: torch.Tensor, num_warps: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (E4M3 [M, K], fp32 scale [M, 1]) in one kernel (the same bits at any
    num_warps: the row's largest magnitude is exact in any order)."""
    num_warps = num_warps or quantize_warps(x.shape[1])
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    scale = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
    _quantize_rows_kernel[(x.shape[0],)](x, q, scale, x.shape[1], x.stride(0), q.stride(0),
                                         FP8_MAX=FP8_MAX,
                                         BLOCK_K=triton.next_power_of_2(x.shape[1]),
                                         num_warps=num_warps, **pdl.launch_options(x.device))
    return q, scale


def fp8_weight_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                      bias: torch.Tensor | None, config: Config,
                      x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [M, K] (bf16/fp16), weight [N, K] E4M3 with unit stride along K, scale [N] or
    [N, 1] fp32, bias [N] or None; x_fp8: `quantize_rows(x)` made already (by the op
    before, e.g. `rmsnorm.rms_norm_fp8`), for the configs that multiply FP8 by FP8."""
    if x.dim() != 2 or weight.dtype != FP8 or weight.stride(1) != 1:
        raise ValueError(f"fp8_weight_linear takes 2-D x and an E4M3 weight contiguous "
                         f"along K, got x {tuple(x.shape)} and a {weight.dtype} weight")
    if config.kernel == "gemv":
        return fp8_gemv.fp8_gemv(x, weight, scale, bias, config.block_n, config.block_k,
                                 config.num_warps, config.num_stages, config.split_k,
                                 config.ahead, config.tickets)
    x = x if x.stride(1) == 1 else x.contiguous()
    fp8_x = "w8a8" in config.kernel
    xq, x_scale = (x, scale) if not fp8_x else x_fp8 or quantize_rows(x)
    if config.kernel in fp8_gemm_tma.KERNELS:
        return fp8_gemm_tma.tma_linear(xq, x_scale, weight, scale, bias, x.dtype,
                                       config.block_n, config.block_k, config.num_warps,
                                       config.num_stages, config.split_k, config.tickets,
                                       config.kernel.endswith("_p"), "bits" in config.kernel,
                                       config.max_block_m)
    (m, k), n = x.shape, weight.shape[0]
    bm, split = block_m(m), config.split_k
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, bm), split)
    y, parts, counters = split_tickets.outputs(m, n, x.dtype, x.device, split,
                                               grid[0] * grid[1], config.tickets)
    _fp8_weight_kernel[grid](
        xq, x_scale, weight, scale.reshape(-1), bias if bias is not None else scale, y,
        parts if parts is not None else y, counters if counters is not None else y, m, n,
        k, xq.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None,
        FP8_X=fp8_x, BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=split, TICKETS=counters is not None,
        EARLY_SCALES=early_scales(bias is not None),
        num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl.launch_options(x.device, (config.block_n, k, weight.element_size())))
    return y.to(x.dtype)


def fast_accum() -> bool:
    """PARASHIFT_FP8_FAST_ACCUM=1 (the default): cuBLASLt sums a prefill's (more than MAX_ROWS
    rows) FP8 products in the tensor cores without promoting partial sums to fp32, as
    torchao's and fbgemm's FP8 inference GEMMs do. On one H200 a 4,096-token 8B prefill took
    63.2 against 66.9 ms, and the error it adds (0.21-0.33% of the exact product at K 4,096-
    14,336) is a tenth of quantizing to E4M3 at all (3.75%; benchmarks/fp8_fast_accum_error.py).
    0 promotes."""
    return switch(FAST_ACCUM_ENV, "1")  # read at each call


def scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None,
                     x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None,
                     fast: bool = False) -> torch.Tensor:
    """cuBLASLt's FP8 GEMM: x quantized per token (x_fp8, where made already), the weight's
    scale per output row; fast: without fp32 promotion of the partial sums."""
    xq, x_scale = x_fp8 or quantize_rows(x if x.stride(1) == 1 else x.contiguous())
    return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale.reshape(1, -1),
                            bias=bias, out_dtype=x.dtype, use_fast_accum=fast)


_choices: dict[tuple, Config | None] = {}


def row_bucket(rows: int) -> int:
    """Rows that share a measured choice: each count up to the GEMV's, then query tiles."""
    return rows if rows <= fp8_gemv.MAX_ROWS else block_m(rows)


def _key(rows: int, weight: torch.Tensor, dtype: torch.dtype, device: torch.device,
         has_bias: bool) -> tuple:
    return (row_bucket(rows), tuple(weight.shape), weight.stride(0), dtype, device, has_bias)


def measured_choice(rows: int, weight: torch.Tensor, dtype: torch.dtype,
                    device: torch.device, has_bias: bool) -> Config | None:
    """`linear`'s choice for this shape where measured (None: cuBLASLt or not measured)."""
    return _choices.get(_key(rows, weight, dtype, device, has_bias))


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
           bias: torch.Tensor | None,
           x_fp8: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The fastest of the Triton kernels and cuBLASLt for this shape (measured on its first
    call outside a CUDA-graph capture; during a capture an unmeasured shape takes
    cuBLASLt). Rows are bucketed by `row_bucket`. x_fp8: x's rows quantized already
    (`quantize_rows` of x [-1, K]), taken by the kernels that quantize them."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > MAX_ROWS or weight.stride(1) != 1:
        fast = rows.shape[0] > MAX_ROWS and fast_accum()
        return scaled_mm_linear(rows, weight, scale, bias, x_fp8, fast).reshape(
            *x.shape[:-1], -1)
    key = _key(rows.shape[0], weight, x.dtype, x.device, bias is not None)
    if key not in _choices:
        if torch.cuda.is_current_stream_capturing():
            return scaled_mm_linear(rows, weight, scale, bias, x_fp8).reshape(*x.shape[:-1], -1)
        with gemm_timing.timing_launches():
            timings = timings_ms(rows, weight, scale, bias)
        _choices[key] = gemm_timing.steady_choice(
            timings, MARGIN, f"FP8 GEMM, {rows.shape[0]} rows x {tuple(weight.shape)}", _label)
    config = _choices[key]
    y = (scaled_mm_linear(rows, weight, scale, bias, x_fp8) if config is None
         else fp8_weight_linear(rows, weight, scale, bias, config, x_fp8))
    return y.reshape(*x.shape[:-1], -1)


def quantizes_activations(rows: int, weight: torch.Tensor, dtype: torch.dtype,
                          device: torch.device, has_bias: bool) -> bool:
    """Whether `linear` of `rows` rows quantizes them per token (cuBLASLt or a w8a8
    config) as far as is known before the call: a shape not yet measured says no unless a
    CUDA graph is being captured (then cuBLASLt takes it)."""
    if rows > MAX_ROWS or weight.stride(1) != 1:
        return True
    key = _key(rows, weight, dtype, device, has_bias)
    if key not in _choices:
        return torch.cuda.is_current_stream_capturing()
    config = _choices[key]
    return config is None or "w8a8" in config.kernel


def chosen() -> list[dict]:
    """What `linear` chose for each shape measured in this process."""
    return [{"rows_up_to": key[0], "weight": list(key[1]), "kernel": _label(config)}
            for key, config in _choices.items()]


def _label(config: Config | None) -> str:
    if config is None:
        return "cuBLASLt"
    label = (f"triton {config.kernel} {config.block_n}x{config.block_k} split {config.split_k}"
             f"{' ahead' if config.ahead else ''}{' tickets' if config.tickets else ''}")
    if config.kernel in fp8_gemm_tma.KERNELS:  # these differ in warps and stages too
        label += f" w{config.num_warps} s{config.num_stages}"
        label += f" m<={config.max_block_m}" if config.max_block_m else ""
    return label


def candidates(rows: int, n: int) -> list[Config]:
    """The Triton configs measured for `rows` rows of an N-row weight, the GEMV's or the TMA
    kernel's first (the preferred among configs that time alike: gemm_timing.steady_choice)."""
    configs = (GEMV_CONFIGS if rows <= fp8_gemv.MAX_ROWS else
               TMA_CONFIGS if fp8_gemm_tma.enabled() else ()) + CONFIGS
    return [c for c in configs if c.block_n <= triton.next_power_of_2(n)]


def timings_ms(x, weight, scale, bias) -> dict[Config | None, float]:
    """Milliseconds per call of cuBLASLt (None) and each Triton config, replayed from CUDA
    graphs over copies of the weight (`gemm_timing`, in the decode chain where asked), or
    with L2 flushed where asked (PARASHIFT_GEMM_TIMING=flushed) or a graph cannot be
    captured; a config this device cannot compile or run is left out."""
    configs = [c for c in candidates(x.shape[0], weight.shape[0])
               if c.kernel not in fp8_gemm_tma.KERNELS or fp8_gemm_tma.takes(weight)]
    if not gemm_timing.flushed():
        try:
            weights = gemm_timing.weight_copies(weight)
            xin, chain = gemm_timing.timed_input(x)
            runs = {None: lambda i: scaled_mm_linear(xin, weights[i], scale, bias)}
            runs.update({c: lambda i, c=c: fp8_weight_linear(xin, weights[i], scale, bias, c)
                         for c in configs})
            timings = gemm_timing.replayed_timings_ms(runs, len(weights), chain)
            if None in timings:
                return timings
        except Exception as exc:  # noqa: BLE001  graphs not capturable here: flush instead
            logger.warning("FP8 GEMM timing in CUDA graphs failed (%s); flushing L2 instead",
                           exc)
    runs = {None: lambda: scaled_mm_linear(x, weight, scale, bias)}
    runs.update({c: lambda c=c: fp8_weight_linear(x, weight, scale, bias, c) for c in configs})
    return gemm_timing.flushed_timings_ms(runs)
