"""Shared by the kernel tests: random inputs, the comparisons, the Triton
interpreter in a child process, CUDA graph capture."""
import importlib
import json
import math
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import triton

ROOT = Path(__file__).parents[2]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# The GPU image's Triton 3.6 interpreter fails on the kernels built on tl.dot (attention, the
# skinny GEMM) with "only 0-dimensional arrays can be converted to Python scalars"; CI's 3.9
# runs them (pyproject pins CI to >= 3.9). On that image the compiled kernels are tested
# instead (the `cuda` tests).
interpreter_runs_dot = pytest.mark.skipif(
    tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9),
    reason="this Triton's interpreter cannot run tl.dot kernels")


def randn(shape, dtype: str, device: str, seed: int = 0, strided: bool = False,
          scale: float = 1.0) -> torch.Tensor:
    """Normal values drawn on the CPU. strided: a view into a wider buffer whose
    rows hold one more last-dim slice first, as q and k are split from the qkv
    projection's output."""
    gen = torch.Generator().manual_seed(seed)
    lead = shape[-1] if strided else 0
    buf = torch.randn(shape[0], lead + math.prod(shape[1:]), generator=gen) * scale
    buf = buf.to(device=device, dtype=getattr(torch, dtype))[:, lead:]
    return buf.unflatten(-1, shape[1:]) if strided else buf.view(shape)


def assert_exact(out: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def assert_last_bits(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal up to the last bits: an fp32 sum added in another order than
    torch's (or another exp) moves fp32 results by a few ulps and flips the
    rounding of rare 16-bit ones by one step."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)
        return
    torch.testing.assert_close(out, ref, rtol=2 * torch.finfo(out.dtype).eps, atol=0)
    flips = int((out != ref).sum())
    assert flips <= 1 + out.numel() // 1000, f"{flips} of {out.numel()} differ"


def assert_graph_replays(fn, inputs: list[torch.Tensor]) -> None:
    """fn() captured in a CUDA graph, replayed on new values of `inputs`, gives
    what it gives run eagerly."""
    fn()  # compiles the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for t in inputs:
        t.copy_(torch.randn_like(t))
    graph.replay()
    assert_exact(out, fn())


def case_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


def case_tests(module: str, check, cases: list[dict], uses_dot: bool = False):
    """The tests every kernel file runs for its `check(**case, dtype, device)`: each
    case in float32 and float16 on the CPU under the Triton interpreter, and in bf16,
    fp16 and fp32 on CUDA. A test module binds them at module level:
    `test_interpreted, test_cuda = case_tests(__name__, check, CASES)`."""
    cpu_cases = [{**case, "dtype": dtype} for dtype in ("float32", "float16") for case in cases]
    interpreted_results = {}

    @(interpreter_runs_dot if uses_dot else lambda test: test)
    @pytest.mark.parametrize("i", range(len(cpu_cases)), ids=[case_id(c) for c in cpu_cases])
    def test_interpreted(i):
        if not interpreted_results:  # one child process runs every case of the module
            interpreted_results.update(enumerate(run_interpreted(module, check.__name__,
                                                                 cpu_cases)))
        if interpreted_results[i] is not None:
            pytest.fail(interpreted_results[i], pytrace=False)

    @cuda
    @pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
    @pytest.mark.parametrize("case", cases, ids=case_id)
    def test_cuda(case, dtype):
        check(**case, dtype=dtype, device="cuda")

    return test_interpreted, test_cuda


# The interpreter's tl.dot is numpy's matmul, i.e. OpenBLAS, which picks its kernels by the
# CPU: on AMD Zen and Intel Haswell kernels a row's sums change with its place in the matrix
# (batch-invariance tests fail there and pass on SkylakeX). One thread of the generic SSE3
# kernels gives every row the same sums on every x86-64 machine.
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "OPENBLAS_CORETYPE": "Prescott",
                   "OPENBLAS_NUM_THREADS": "1"}


def run_interpreted(module: str, check: str, cases: list[dict]) -> list[str | None]:
    """Calls module.check(**case) for each case under the Triton interpreter,
    on the CPU, in a child process: TRITON_INTERPRET must be set before
    triton.jit decorates a kernel, and this process imports them compiled.
    Returns, per case, None if it passed, else its traceback."""
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.common", module, check],
                          input=json.dumps(cases), capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **INTERPRETER_ENV}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _run_cases(module: str, check: str) -> None:
    fn = getattr(importlib.import_module(module), check)
    results = []
    for case in json.load(sys.stdin):
        try:
            fn(**case)
            results.append(None)
        except Exception:
            results.append(traceback.format_exc())
    print(json.dumps(results))


if __name__ == "__main__":
    _run_cases(*sys.argv[1:])
