"""The dtype `parashift generate` runs in on a CPU when none is given: bf16 where the CPU
multiplies bf16 natively (AMX or AVX-512 BF16; there the model runs faster in bf16, see
docs/results.md's CPU rows), else fp32 (bf16 would be emulated, slower than fp32)."""
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def native_bf16_feature() -> str | None:
    """The CPU feature flag that makes bf16 matmuls native, or None."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    for flag in NATIVE_BF16_FLAGS:
        if flag in flags:
            return flag
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)  # where /proc isn't
    return "avx512_bf16" if probe is not None and probe() else None


def cpu_dtype_choice() -> tuple[str, str]:
    """(dtype, why) for a CPU run whose dtype is `auto`."""
    feature = native_bf16_feature()
    if feature:
        return "bfloat16", f"the CPU has {feature}"
    return "float32", "the CPU has no native bf16 matmul (amx_bf16 / avx512_bf16)"
