"""`--dtype auto` on a CPU: bf16 only where the CPU multiplies bf16 natively."""
import pytest

from parashift.engine import cpu_dtype


@pytest.mark.parametrize("flags,expected", [
    ("fpu sse avx2 avx512f avx512_bf16", ("bfloat16", "avx512_bf16")),
    ("fpu avx512f amx_tile amx_bf16 avx512_bf16", ("bfloat16", "amx_bf16")),
    ("fpu sse avx2 avx512f", ("float32", "no native bf16")),
])
def test_bf16_only_with_native_bf16_matmuls(monkeypatch, tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    real_path = cpu_dtype.Path
    monkeypatch.setattr(cpu_dtype, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo"
                        else real_path(p))
    monkeypatch.setattr(cpu_dtype.torch.cpu, "_is_avx512_bf16_supported", lambda: False,
                        raising=False)
    dtype, why = cpu_dtype.cpu_dtype_choice()
    assert dtype == expected[0] and expected[1] in why
