"""`parashift profile`: measure the compute profile of the device this runs on (and, on a
machine of several GPUs, the link profile between them, through torch.distributed with
NCCL). On a CPU it runs small sizes (for tests); on CUDA full sweeps.

Each kernel family is timed at a few sizes and fitted as the profile's roofline: its launch
cost from the smallest size, its bandwidth from a size bound by bytes, its matrix rate from
one bound by FLOPs."""
import os
import subprocess
import time
from dataclasses import dataclass

import torch

from parashift.cost.profile import ComputeProfile, Roofline


@dataclass(frozen=True)
class Sweep:
    """Sizes to time: `small` for a CPU (tests), full for a GPU."""
    hidden: int
    rows_small: int
    rows_large: int
    copy_bytes: int
    context: int
    repeats: int

    @classmethod
    def for_device(cls, device: torch.device) -> "Sweep":
        if device.type == "cuda":
            return cls(hidden=8192, rows_small=1, rows_large=8192, copy_bytes=1 << 30,
                       context=8192, repeats=20)
        return cls(hidden=256, rows_small=1, rows_large=256, copy_bytes=1 << 22, context=256,
                   repeats=3)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of one call, after a warm-up call."""
    fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_compute(device: torch.device, commit: str = "") -> ComputeProfile:
    sweep = Sweep.for_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = torch.tensor([], dtype=dtype).element_size()
    t = lambda fn: timed(fn, device, sweep.repeats)  # noqa: E731
    src = torch.empty(sweep.copy_bytes // size, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    hbm = 2 * sweep.copy_bytes / t(lambda: dst.copy_(src))
    big = torch.randn(sweep.rows_large, sweep.hidden, dtype=dtype, device=device)
    weight = torch.randn(sweep.hidden, sweep.hidden, dtype=dtype, device=device)
    matmul = 2 * sweep.rows_large * sweep.hidden ** 2 / t(lambda: big @ weight)
    gemm = _gemm_fit(sweep, weight, hbm, matmul, size, t)
    decode, prefill = _attention_fits(sweep, dtype, device, hbm, matmul, size, t)
    elementwise = _elementwise_fit(big, hbm, size, t)
    launch = t(lambda: torch.empty(1, device=device).add_(1))
    rows = torch.randn(64, 32000, dtype=dtype, device=device)
    sampler = t(lambda: rows.argmax(dim=-1))
    pinned = torch.empty_like(src, device="cpu", pin_memory=device.type == "cuda")
    to_device = sweep.copy_bytes / t(lambda: src.copy_(pinned, non_blocking=False))
    memory = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ComputeProfile(
        device=name, source=f"measured by `parashift profile` at commit {commit or 'unknown'}",
        hbm_bytes_per_s=hbm, matmul_flops=matmul, memory_bytes=float(memory),
        memory_utilization=0.9, activation_bytes=0.03 * memory, gemm=gemm,
        decode_attention=decode, prefill_attention=prefill, elementwise=elementwise, moe=gemm,
        sampler_s=sampler, sampler_row_s=sampler / 64, host_step_s=launch,
        eager_launch_s=launch, kernels_per_layer=14, host_to_device_bytes_per_s=to_device,
        notes={"sweep": vars(sweep), "dtype": str(dtype),
               "moe": "the dense GEMM's fit (the expert kernels are not timed apart)",
               "host_step_s": "one eager launch (graphs' host time is not timed apart)",
               "activation_bytes": "3% of memory (assumed)"})


def _fit(hbm: float, matmul: float, small_s: float, small_bytes: float, large_s: float,
         large_bytes: float, large_flops: float, launch_s: float) -> Roofline:
    """A roofline through a latency-bound size, a bytes-bound one and a FLOPs-bound one."""
    bw = small_bytes / max(small_s - launch_s, 1e-9) / hbm
    flops = large_flops / max(large_s - launch_s, 1e-9) / matmul
    return Roofline(min(bw, 1.0), min(flops, 1.0), max(launch_s, 0.0))


def _gemm_fit(sweep: Sweep, weight, hbm, matmul, size, t) -> Roofline:
    tiny = torch.randn(1, 64, dtype=weight.dtype, device=weight.device)
    tiny_w = torch.randn(64, 64, dtype=weight.dtype, device=weight.device)
    launch = t(lambda: tiny @ tiny_w)
    row = torch.randn(sweep.rows_small, sweep.hidden, dtype=weight.dtype, device=weight.device)
    big = torch.randn(sweep.rows_large, sweep.hidden, dtype=weight.dtype, device=weight.device)
    h = sweep.hidden
    return _fit(hbm, matmul, t(lambda: row @ weight), size * h * h, t(lambda: big @ weight),
                size * (h * h + 2 * sweep.rows_large * h), 2 * sweep.rows_large * h * h, launch)


def _attention_fits(sweep: Sweep, dtype, device, hbm, matmul, size, t):
    import torch.nn.functional as F
    heads, d, ctx = 8, 128, sweep.context
    q1 = torch.randn(64, heads, 1, d, dtype=dtype, device=device)
    kv = torch.randn(64, heads, ctx, d, dtype=dtype, device=device)
    qs = torch.randn(1, heads, 1, d, dtype=dtype, device=device)
    kvs = torch.randn(1, heads, 16, d, dtype=dtype, device=device)
    launch = t(lambda: F.scaled_dot_product_attention(qs, kvs, kvs))
    decode_s = t(lambda: F.scaled_dot_product_attention(q1, kv, kv))
    decode_bytes = 2 * kv.numel() * size
    qp = torch.randn(1, heads, ctx, d, dtype=dtype, device=device)
    prefill_s = t(lambda: F.scaled_dot_product_attention(qp, qp, qp, is_causal=True))
    prefill_flops = 4 * heads * d * ctx * ctx / 2
    decode = _fit(hbm, matmul, decode_s, decode_bytes, decode_s, decode_bytes,
                  4 * 64 * heads * d * ctx, launch)
    prefill = _fit(hbm, matmul, prefill_s, 3 * qp.numel() * size, prefill_s,
                   3 * qp.numel() * size, prefill_flops, launch)
    return decode, prefill


def _elementwise_fit(big, hbm, size, t) -> Roofline:
    small = big[:1]
    norm = lambda x: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)  # noqa: E731
    launch = t(lambda: norm(small))
    bw = 2 * big.numel() * size / max(t(lambda: norm(big)) - launch, 1e-9) / hbm
    return Roofline(min(bw, 1.0), 1.0, launch)


def current_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
