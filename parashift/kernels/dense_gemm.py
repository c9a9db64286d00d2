"""The 16-bit linear layers' and LM head's GEMM at decode's wider batches (MIN_ROWS to MAX_ROWS
rows): cuBLAS
or the TMA kernel (dense_gemm_tma.py), whichever measured faster for the shape and row bucket
as decode runs it (gemm_timing.py's chain: PDL on, each call after a kernel writing its input,
the weight read from HBM).

PARASHIFT_DENSE_TMA: 1 (the default) or 0 (every shape on cuBLAS). Read at each call, so a
CUDA graph keeps what its capture read and one process can A/B both (the choices made at its
first call stay)."""
import torch
import torch.nn.functional as F
import triton

from parashift.engine_switches import switch
from parashift.kernels import gemm_timing
from parashift.kernels.dense_gemm_tma import Config, takes, tma_linear

ENV, DEFAULT = "PARASHIFT_DENSE_TMA", "1"
# at 256 rows (one H200, 8B bf16 decode b256) the choice took the kernel for o alone, and the
# step ran 16.22 ms against cuBLAS's 15.95; 65-128 rows were not measured in the engine
# (docs/benchmark_log.md, helper dense64)
MIN_ROWS, MAX_ROWS = 33, 64
# the kernel must beat cuBLAS by this factor to be chosen
MARGIN = 0.98

# (block_n, block_m, block_k, warps, stages, split_k); shared memory a stage is
# 2 (block_n + block_m) block_k bytes, at most ~192 KB in all
CONFIGS = (
    Config(64, 64, 128, 4, 6), Config(64, 64, 128, 4, 6, 2), Config(64, 64, 256, 4, 3),
    Config(64, 64, 256, 4, 3, 2), Config(128, 64, 128, 8, 4), Config(128, 64, 64, 4, 8),
    Config(256, 64, 64, 8, 4),
    # two programs an SM (96 KB of shared memory)
    Config(64, 64, 128, 4, 3),
)
# measured and left out (one H200, 8B shapes at 64 rows): K split in 3-8, 256-row weight
# tiles split, 32-row weight tiles (mma.sync: 1.2-1.9x slower than 64-row ones)

_choices: dict[tuple, Config | None] = {}


def enabled() -> bool:
    """PARASHIFT_DENSE_TMA (0 or 1)."""
    return switch(ENV, DEFAULT)


def handles(x: torch.Tensor) -> bool:
    """Whether `linear` is this module's call: a 2-D 16-bit x of MIN_ROWS to MAX_ROWS rows
    (fp32 stays on cuBLAS: tl.dot would take it in TF32)."""
    return (x.dim() == 2 and MIN_ROWS <= x.shape[0] <= MAX_ROWS
            and x.dtype in (torch.bfloat16, torch.float16))


def row_bucket(rows: int) -> int:
    return triton.next_power_of_2(rows)


def candidates(rows: int) -> list[Config]:
    """The configs timed at `rows`: row tiles no wider than the bucket (64 at the least)."""
    return [c for c in CONFIGS if c.block_m <= max(64, row_bucket(rows))]


def _key(rows: int, weight: torch.Tensor, dtype: torch.dtype, device: torch.device,
         has_bias: bool) -> tuple:
    return (row_bucket(rows), tuple(weight.shape), weight.stride(0), dtype, device, has_bias)


def measured_choice(rows: int, weight: torch.Tensor, dtype: torch.dtype,
                    device: torch.device, has_bias: bool) -> Config | None:
    """`linear`'s choice for this shape where measured (None: cuBLAS or not measured)."""
    return _choices.get(_key(rows, weight, dtype, device, has_bias))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear, or the TMA kernel for the shapes and row buckets where it measured faster
    (gemm_timing.chosen_once: during a CUDA graph capture an unmeasured shape takes cuBLAS)."""
    if not enabled() or x.dtype != weight.dtype or not takes(weight):
        return F.linear(x, weight, bias)
    key = _key(x.shape[0], weight, x.dtype, x.device, bias is not None)
    config = gemm_timing.chosen_once(_choices, key, lambda: _measure(x, weight, bias))
    return F.linear(x, weight, bias) if config is None else tma_linear(x, weight, bias, config)


def _measure(x, weight, bias) -> Config | None:
    return gemm_timing.steady_choice(
        timings_ms(x, weight, bias), MARGIN,
        f"dense GEMM, {row_bucket(x.shape[0])} rows x {tuple(weight.shape)}", label)


def timings_ms(x, weight, bias) -> dict[Config | None, float]:
    """Median ms per call of cuBLAS (None) and each candidate, replayed from CUDA graphs over
    copies of the weight, in the decode chain unless PARASHIFT_GEMM_TIMING asks otherwise (a
    candidate that fails to compile or run is left out)."""
    return gemm_timing.against_library_ms(x, weight, bias, tma_linear,
                                          candidates(x.shape[0]))


def chosen() -> list[dict]:
    """What `linear` chose for each shape measured in this process."""
    return [{"rows": key[0], "weight": list(key[1]), "kernel": label(config)}
            for key, config in _choices.items()]


def label(config: Config | None) -> str:
    if config is None:
        return "cuBLAS"
    return (f"tma {config.block_n}x{config.block_m}x{config.block_k} w{config.num_warps} "
            f"s{config.num_stages}{f' split {config.split_k}' if config.split_k > 1 else ''}")
