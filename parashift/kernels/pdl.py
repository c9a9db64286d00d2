"""Programmatic dependent launch (PDL) of the decode kernels, Hopper and later.

A kernel launched with PDL may start while the kernel before it in the stream finishes: its
programs fill the SMs the other's tail leaves idle. Every such kernel, under its USE_PDL
constexpr, first does only what reads nothing an earlier kernel writes and writes nothing
(index math, L2 prefetches of its weights), then `grid_wait`s for the kernel before to
complete and its writes to be visible, and only then reads its inputs and writes; it lets
its own dependents launch after its wait (where: below). The wait is transitive: the kernel
before did not complete before its own wait returned. A kernel launched without PDL
(cuBLAS, torch's ops) starts after the one before completes, as always, so any mix of
kernels stays ordered. PDL moves no arithmetic: a kernel's results are the same bits with it
on and off.

PARASHIFT_PDL picks where a kernel lets its dependents launch: 0 never (no PDL); 1 or early
(the default), right after its wait, so the next kernel's programs take the SM slots its own
programs free; late, once it has read its inputs (after its main loop, before its stores), so
they arrive for its tail only. PARASHIFT_PDL_PREFETCH_KB (0 by default: none) is about how
much of its weight a streaming kernel's program pulls into L2 before its wait. Measured on an
H200 (8B decode, CUDA graphs; docs/benchmark_log.md, session 41): early without a prefetch
was 1.03x at bf16 batch 1, 1.06x at FP8 batch 1, 1.02x at FP8 batch 64, 1.00x at bf16 batch
64; a 16 KB prefetch made bf16 batch 1 slower. Both are read at each launch (a CUDA graph
keeps what its capture read). PDL takes effect only on a CUDA device of compute capability 9
or more, compiled (never under the Triton interpreter), and where this Triton has the grid
dependency ops and the launch option."""
import contextlib
import functools
import logging
import os

import torch
import triton
import triton.language as tl

from parashift.engine_switches import switch

logger = logging.getLogger(__name__)

ENV = "PARASHIFT_PDL"
PREFETCH_ENV = "PARASHIFT_PDL_PREFETCH_KB"
# 1 (the default): the RMSNorm and rotary kernels load the inputs no kernel writes (the norm
# weight; positions, cos, sin, slots) before their wait; 0: after it (read at each launch). On
# an H200, 8B FP8 decode chain at one row: 76.7 µs a layer against 78.1 (session 45)
EARLY_LOADS_ENV = "PARASHIFT_PDL_EARLY_LOADS"
DEFAULT_MODE = "1"
DEFAULT_PREFETCH_KB = "0"
LINE_BYTES = tl.constexpr(128)  # an L2 cache line: one prefetch each
# a kernel's USE_PDL constexpr: where it calls launch_dependents (OFF: no PDL)
OFF, EARLY, LATE = 0, 1, 2
_EARLY, _LATE = tl.constexpr(EARLY), tl.constexpr(LATE)  # as the kernels see them
MODES = {"0": OFF, "1": EARLY, "early": EARLY, "late": LATE}
_suspended = 0  # `suspended()` blocks open


def pdl_mode(device: torch.device) -> int:
    """OFF, EARLY or LATE: PARASHIFT_PDL's placement where `device` and this Triton support
    PDL, else OFF."""
    flag = os.environ.get(ENV, DEFAULT_MODE)  # read at each launch: one dict lookup
    if flag not in MODES:
        raise ValueError(f"{ENV}={flag!r}: expected 0 (off), 1 or early, or late")
    if MODES[flag] == OFF or _suspended or device.type != "cuda" or _interpreted():
        return OFF
    index = device.index if device.index is not None else torch.cuda.current_device()
    return MODES[flag] if _device_supports(index) else OFF


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL (PARASHIFT_PDL on and a device and Triton
    that support it)."""
    return pdl_mode(device) != OFF


def launch_options(device: torch.device, prefetch: tuple[int, int, int] | None = None) -> dict:
    """The keyword arguments a PDL-aware kernel's launch takes: its USE_PDL constexpr (the
    mode), when on Triton's launch_pdl option, and for a kernel streaming a weight (prefetch:
    the rows a program owns, K, the weight's element bytes) its PREFETCH_K constexpr (0 when
    off)."""
    mode = pdl_mode(device)
    options = {"USE_PDL": mode, "launch_pdl": True} if mode else {"USE_PDL": OFF}
    if prefetch is not None:
        options["PREFETCH_K"] = prefetch_cols(*prefetch) if mode else 0
    return options


@contextlib.contextmanager
def suspended():
    """Within it, kernels launch without PDL. The GEMMs time their configs within it:
    under PDL back-to-back launches of one kernel would overlap as no decode step's do, and
    the choice is then the same with PDL off and on."""
    global _suspended
    _suspended += 1
    try:
        yield
    finally:
        _suspended -= 1


def early_loads() -> bool:
    """PARASHIFT_PDL_EARLY_LOADS: whether the small kernels that can load their constant
    inputs before the wait do."""
    return switch(EARLY_LOADS_ENV, "1")


def prefetch_bytes() -> int:
    """PARASHIFT_PDL_PREFETCH_KB in bytes: what of its weight a program pulls into L2 before
    its wait."""
    value = os.environ.get(PREFETCH_ENV, DEFAULT_PREFETCH_KB)
    if not value.isdigit():
        raise ValueError(f"{PREFETCH_ENV}={value!r}: expected a whole number of KB (0: none)")
    return int(value) * 1024


def prefetch_cols(rows: int, k: int, elem_bytes: int, budget: int | None = None) -> int:
    """The columns of `rows` weight rows a program prefetches: about `budget` bytes
    (prefetch_bytes() where None), at least a cache line, at most k rounded up; a power of
    two (0 where the budget is 0)."""
    budget = prefetch_bytes() if budget is None else budget
    if budget == 0:
        return 0
    line = LINE_BYTES.value // elem_bytes
    cols = triton.next_power_of_2(max(budget // (rows * elem_bytes), 1))
    return max(line, min(cols, triton.next_power_of_2(k)))


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _device_supports(index: int) -> bool:
    capability = torch.cuda.get_device_capability(index)
    if capability[0] < 9 or not triton_supports():
        log = logger.warning if ENV in os.environ else logger.debug  # asked for, or the default
        log("%s is on but PDL is off on cuda:%d (compute capability %s, Triton "
                       "%s %s it)", ENV, index, capability, triton.__version__,
                       "supports" if triton_supports() else "does not support")
        return False
    logger.info("programmatic dependent launch on for cuda:%d", index)
    return True


@functools.cache
def triton_supports() -> bool:
    """This Triton has tl.extra.cuda's grid dependency ops and the launch_pdl option."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda
    except ImportError:
        return False
    return (hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")
            and "launch_pdl" in CUDAOptions.__dataclass_fields__)


@triton.jit
def grid_wait(USE_PDL: tl.constexpr):
    """Waits for the kernel before to complete, its writes visible; a no-op without PDL."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def launch_dependents(USE_PDL: tl.constexpr):
    """Lets the next kernel launch (its programs start once every program here has called
    this or exited); call after grid_wait, so the chain runs at most one kernel ahead."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def start(USE_PDL: tl.constexpr):
    """A kernel's first step: waits for the kernel before, then (EARLY) lets the next
    launch."""
    grid_wait(USE_PDL)
    if USE_PDL == _EARLY:
        launch_dependents(USE_PDL)


@triton.jit
def inputs_read(USE_PDL: tl.constexpr):
    """Where a kernel has read its inputs (after its main loop, before its stores): LATE lets
    the next kernel launch here."""
    if USE_PDL == _LATE:
        launch_dependents(USE_PDL)


@triton.jit
def start_streaming(w_ptr, stride_wn, N, K, first_n, first_k, BLOCK_N: tl.constexpr,
                    PREFETCH_K: tl.constexpr, USE_PDL: tl.constexpr):
    """`start` of a kernel whose program streams rows first_n.. of the weight [N, K] from
    column first_k: the weight is no earlier kernel's output, so its first PREFETCH_K
    columns are pulled into L2 before the wait, during the kernel before's tail."""
    if USE_PDL and PREFETCH_K > 0:
        prefetch_rows(w_ptr + first_n.to(tl.int64) * stride_wn + first_k, stride_wn,
                      N - first_n, K - first_k, BLOCK_N, PREFETCH_K)
    start(USE_PDL)


@triton.jit
def prefetch_rows(first_ptr, stride, n_rows, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Pulls the first COLS columns of ROWS rows from first_ptr (of n_rows x n_cols left in
    the matrix, rows `stride` elements apart) into L2, a prefetch per cache line (COLS a
    multiple of one); reads nothing into registers and writes nothing."""
    rows = tl.arange(0, ROWS)[:, None]
    line: tl.constexpr = LINE_BYTES // (first_ptr.dtype.element_ty.primitive_bitwidth // 8)
    cols = tl.arange(0, COLS // line)[None, :] * line
    # past the matrix: the last row's or column's line again (a prefetch stays in bounds)
    rows = tl.minimum(rows, n_rows - 1).to(tl.int64)
    cols = tl.maximum(tl.minimum(cols, n_cols - 1), 0)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                              [first_ptr + rows * stride + cols], dtype=tl.int32,
                              is_pure=False, pack=1)
