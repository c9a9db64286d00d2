"""`parashift profile`: measure the compute profile of the device this runs on (and, on a
machine of several GPUs, the link profile between them, through torch.distributed with
NCCL). On a CPU it runs small sizes (for tests); on CUDA full sweeps, or fewer sizes with
`quick`.

Each kernel family is the engine's own kernel timed at several sizes (measure_kernels.py)
and fitted in the step model's variables (fit.py): GEMMs by bytes at few rows and by FLOPs
at many; decode attention by the KV bytes of a batch x context grid; prefill attention by
its causal FLOPs; elementwise work by bytes (the fused residual-add RMSNorm, one of the
ELEMENTWISE_KERNELS a layer launches); the sampler per step and per row. Host work per step
and per sequence comes from decode steps of the engine itself (planner/measure_host.py)."""
import os
import subprocess
from dataclasses import asdict, dataclass

import torch

from parashift.cost import fit
from parashift.cost.measure_kernels import (Timer, attention_seconds, eager_launch_s,
                                            fp8_gemm_points, gemm_points, norm_points,
                                            sampler_points)
from parashift.cost.profile import ComputeProfile, Roofline
from parashift.cost.step import ELEMENTWISE_KERNELS


@dataclass(frozen=True)
class Sweep:
    """Sizes to time: small for a CPU (tests), full for a GPU, fewer with `quick`."""
    gemm_shapes: tuple       # (n, k) of the weights
    gemm_rows_bytes: tuple   # rows bound by the weights' bytes
    gemm_rows_flops: tuple   # rows bound by FLOPs
    heads: tuple             # (query heads, KV heads, head dim) of the attention timed
    decode_batches: tuple
    decode_contexts: tuple
    prefill_tokens: tuple
    norm_hidden: int
    norm_rows: tuple
    vocab: int
    copy_bytes: int
    host_batches: tuple
    repeats: int

    @classmethod
    def for_device(cls, device: torch.device, quick: bool = False) -> "Sweep":
        if device.type != "cuda":
            return cls(((256, 256), (1024, 1024)), (1, 4), (256, 512), (4, 2, 32), (1, 8),
                       (64, 512), (64, 256, 1024), 256, (1, 64, 1024), 4096, 1 << 22, (1, 8), 5)
        if quick:
            return cls(((6144, 4096), (4096, 14336)), (1, 16), (4096, 8192), (32, 8, 128),
                       (1, 64, 256), (1024, 8192), (2048, 8192), 4096, (1, 256, 16384),
                       128256, 1 << 30, (1, 64, 256), 10)
        return cls(((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)), (1, 8, 32),
                   (2048, 4096, 8192), (32, 8, 128), (1, 16, 64, 256), (512, 2048, 8192),
                   (1024, 2048, 4096, 8192), 4096, (1, 64, 1024, 16384, 65536), 128256,
                   1 << 30, (1, 16, 64, 256), 20)


def measure_compute(device: torch.device, commit: str = "", quick: bool = False
                    ) -> ComputeProfile:
    """The kernels' profile; its host terms are left at 0 for planner/measure_host.py."""
    sweep = Sweep.for_device(device, quick)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = torch.tensor([], dtype=dtype).element_size()
    timer = Timer(device, sweep.repeats)
    hbm = _copy_rate(timer, sweep.copy_bytes, dtype)
    gemm, matmul, timed = _retried(lambda: _gemm_fit(timer, sweep, dtype, size, hbm,
                                                     gemm_points))
    fp8, fp8_note = (None, 0.0), "not timed: needs CUDA of compute capability 8.9 or more"
    if _fp8_gemm_runs(device):
        try:
            fp8 = _retried(lambda: _gemm_fit(timer, sweep, dtype, size, hbm, fp8_gemm_points,
                                             1))[:2]
            fp8_note = "the engine's FP8-weight GEMM (kernels/fp8_gemm.py)"
        except Exception as e:  # noqa: BLE001  the rest of the profile stands without it
            fp8_note = f"not timed: {type(e).__name__}: {e}"
    decode, prefill = _retried(lambda: _attention_fits(timer, sweep, dtype, size, hbm, matmul))
    elementwise = _retried(lambda: fit.roofline(
        norm_points(timer, sweep.norm_hidden, sweep.norm_rows, dtype), [], hbm, matmul,
        launch_scale=ELEMENTWISE_KERNELS))
    sampler_s, sampler_row_s = fit.host_line(sampler_points(timer, sweep.vocab, (1, 256)))
    memory = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
              else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ComputeProfile(
        device=name, source=f"measured by `parashift profile` at commit {commit or 'unknown'}",
        hbm_bytes_per_s=hbm, matmul_flops=matmul, memory_bytes=float(memory),
        memory_utilization=0.9, activation_bytes=0.03 * memory, gemm=gemm,
        decode_attention=decode, prefill_attention=prefill, elementwise=elementwise, moe=gemm,
        sampler_s=sampler_s, sampler_row_s=sampler_row_s, host_step_s=0.0,
        eager_launch_s=eager_launch_s(device, sweep.norm_hidden, dtype), kernels_per_layer=14,
        host_to_device_bytes_per_s=_to_device_rate(device, sweep.copy_bytes),
        fp8_gemm=fp8[0], fp8_matmul_flops=fp8[1], gemm_timed=timed,
        notes={"sweep": asdict(sweep), "dtype": str(dtype), "quick": quick,
               "moe": "the dense GEMM's fit (the expert kernels are not timed apart)",
               "decode_attention.flops_eff": "the prefill attention's (decode is bound by bytes)",
               "activation_bytes": "3% of memory (assumed)", "fp8_gemm": fp8_note})


def _retried(measure, attempts: int = 3):
    """A family timed and fitted again where its points did not fit (a busy host's samples
    can make time shrink with size); the last attempt's error stands."""
    for attempt in range(attempts):
        try:
            return measure()
        except ValueError:
            if attempt == attempts - 1:
                raise


def _copy_rate(timer: Timer, nbytes: int, dtype) -> float:
    src = torch.empty(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype,
                      device=timer.device)
    dst = torch.empty_like(src)
    return 2 * nbytes / timer(lambda: dst.copy_(src))


def _to_device_rate(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    return nbytes / Timer(device, 3)(lambda: src.copy_(pinned))


def _fp8_gemm_runs(device: torch.device) -> bool:
    """FP8 GEMMs need CUDA of compute capability 8.9 or more (Ada, Hopper)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _gemm_fit(timer: Timer, sweep: Sweep, dtype, size: int, hbm: float, points,
              weight_size: int | None = None) -> tuple[Roofline, float, tuple]:
    """A GEMM family's roofline, its matrix rate (the best of its large GEMMs) and its
    few-row timings by shape, (n, k, rows, seconds) (the profile's `gemm_timed`);
    `weight_size`: bytes of a weight element where not the activations' (FP8)."""
    small = points(timer, sweep.gemm_shapes, sweep.gemm_rows_bytes, dtype)
    large = points(timer, sweep.gemm_shapes, sweep.gemm_rows_flops, dtype)
    matmul = max(2.0 * r * n * k / s for r, n, k, s in large)
    bytes_points = [((weight_size or size) * n * k + size * r * (n + k), s)
                    for r, n, k, s in small]
    flops_points = [(2.0 * r * n * k, s) for r, n, k, s in large]
    timed = tuple((n, k, r, s) for r, n, k, s in small)
    return fit.roofline(bytes_points, flops_points, hbm, matmul), matmul, timed


def _attention_fits(timer: Timer, sweep: Sweep, dtype, size: int, hbm: float,
                    matmul: float) -> tuple[Roofline, Roofline]:
    """Decode by the KV bytes it reads (cost/step.py's count) over batch x context; prefill
    by its causal FLOPs (its own fixed cost; decode's bandwidth)."""
    heads, kv_heads, d = sweep.heads
    decode_points = []
    for batch in sweep.decode_batches:
        for ctx in sweep.decode_contexts:
            seconds = attention_seconds(timer, dtype, heads, kv_heads, d, [1] * batch,
                                        [ctx] * batch)
            nbytes = batch * (ctx * 2 * kv_heads * d * size + heads * d * 2 * size)
            decode_points.append((nbytes, seconds))
    launch, bw = fit.bytes_line(decode_points, hbm)
    prefill_points = [(4.0 * heads * d * n * n / 2,
                       attention_seconds(timer, dtype, heads, kv_heads, d, [n], [n]))
                      for n in sweep.prefill_tokens]
    prefill_launch, flops_eff = fit.flops_line(prefill_points, matmul)
    return Roofline(bw, flops_eff, launch), Roofline(bw, flops_eff, prefill_launch)


def current_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
