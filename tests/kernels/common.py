"""Shared by the kernel tests: random inputs, the comparisons, the Triton
interpreter in a child process, CUDA graph capture."""
import importlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


def assert_fp8_rows(q: torch.Tensor, scale: torch.Tensor,
                    reference: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor) -> None:
    """A fused kernel's E4M3 rows of `out` and their scales are the reference kernel's bit for
    bit (`fp8_gemm.quantize_rows(out)`) and, on CUDA, torch's quantization of `out` (the
    interpreter's E4M3 cast rounds some values that carry into the next binade wrongly, alike
    in both kernels)."""
    rows = out.reshape(-1, out.shape[-1])
    assert q.dtype == torch.float8_e4m3fn and q.shape == rows.shape
    assert scale.dtype == torch.float32 and scale.shape == (rows.shape[0], 1)
    assert torch.equal(q.view(torch.uint8), reference[0].view(torch.uint8))
    assert_exact(scale, reference[1])
    if q.is_cuda:
        expected = rows.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 448.0
        torch.testing.assert_close(scale, expected, rtol=1e-6, atol=0)
        torch.testing.assert_close(q.float(), (rows.float() / scale).to(q.dtype).float(),
                                   rtol=0.125, atol=2 ** -9)


TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                torch.float8_e4m3fn: "fp8e4nv"}


def sm90_ttgir(kernel, args: dict, constexprs: dict, num_warps: int) -> str:
    """The kernel compiled for an H100/H200 (no GPU needed: Triton ships ptxas) as Triton's
    GPU IR, where the layouts it chose show. args: name -> a torch.dtype (a pointer to it,
    16-byte aligned), "fp32" or "i32" (a scalar); constexprs: name -> value."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {name: f"*{TRITON_TYPES[t]}" if isinstance(t, torch.dtype) else t
                 for name, t in args.items()}
    signature.update({name: "constexpr" for name in constexprs})
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(args.values())
               if isinstance(t, torch.dtype)}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "enable_fp_fusion": False})
    return compiled.asm["ttgir"]


def reduction_layouts(ttgir: str) -> list[str]:
    """The layout of each tt.reduce's operand, in the IR's order (a thread's elements are
    added in order, then across threads: the layout fixes a sum's order)."""
    aliases = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
    operands = re.findall(r'"tt\.reduce"\(.*?\}\) : \(tensor<[^,]+, (#\w+)>', ttgir, re.S)
    return [aliases.get(layout, layout) for layout in operands]


def as_bytes(tensors) -> torch.Tensor:
    """The tensors' bytes, one after the other (outputs of several dtypes compared at once)."""
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])


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


def case_tests(module: str, check, cases: list[dict], uses_dot: bool = False,
               variants_in_one_dtype: bool = False):
    """The tests every kernel file runs for its `check(**case, dtype, device)`: each
    case in float32 and float16 on the CPU under the Triton interpreter, and in bf16,
    fp16 and fp32 on CUDA. A test module binds them at module level:
    `test_interpreted, test_cuda = case_tests(__name__, check, CASES)`.
    variants_in_one_dtype: the interpreter runs the first case in both dtypes and each
    later one in one of them, in turn (for checks slow to interpret; CUDA runs all)."""
    cpu_cases = interpreter_cases(cases, variants_in_one_dtype)

    @(interpreter_runs_dot if uses_dot else lambda test: test)
    @pytest.mark.parametrize("i", range(len(cpu_cases)), ids=[case_id(c) for c in cpu_cases])
    @interpreted(module, check.__name__, cpu_cases)
    def test_interpreted(i):
        interpreted_result(module, check.__name__, i)

    return test_interpreted, cuda_tests(check, cases)


def interpreter_cases(cases: list[dict], variants_in_one_dtype: bool) -> list[dict]:
    """Each case in float32 and in float16; variants_in_one_dtype: the first case in both,
    each later one in one of them, in turn."""
    if not variants_in_one_dtype:
        return [{**case, "dtype": dtype} for dtype in ("float32", "float16") for case in cases]
    return ([{**cases[0], "dtype": "float32"}, {**cases[0], "dtype": "float16"}]
            + [{**case, "dtype": ("float16", "float32")[i % 2]}
               for i, case in enumerate(cases[1:])])


def cuda_tests(check, cases: list[dict]):
    """The CUDA test of `check(**case, dtype, device)`: each case in bf16, fp16 and fp32
    (also for cases beyond the interpreted ones: a model's real shapes)."""
    @cuda
    @pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
    @pytest.mark.parametrize("case", cases, ids=case_id)
    def test_cuda(case, dtype):
        check(**case, dtype=dtype, device="cuda")

    return test_cuda


# The interpreter's tl.dot is numpy's matmul, i.e. OpenBLAS, which picks its kernels by the
# CPU: on AMD Zen and Intel Haswell kernels a row's sums change with its place in the matrix
# (batch-invariance tests fail there and pass on SkylakeX). One thread of the generic SSE3
# kernels gives every row the same sums on every x86-64 machine.
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "OPENBLAS_CORETYPE": "Prescott",
                   "OPENBLAS_NUM_THREADS": "1"}


def interpreted(module: str, check: str, cases: list[dict]):
    """Marks a test whose case i is `interpreted_result(module, check, i)`: the session
    runs these checks in the background from its start (start_in_background)."""
    _CASES[module, check] = cases

    def mark(test):
        test.interpreted_check = (module, check)
        return test
    return mark


def interpreted_result(module: str, check: str, i: int) -> None:
    """Fails the test if case i of module.check failed under the interpreter."""
    key = (module, check)
    if key not in _results:
        _results[key] = (_background.take(key) if _background and key in _background.keys
                         else run_interpreted(module, check, _CASES[key]))
    if _results[key][i] is not None:
        pytest.fail(_results[key][i], pytrace=False)


_CASES: dict[tuple[str, str], list[dict]] = {}  # the checks' cases, as the tests named them
_results: dict[tuple[str, str], list[str | None]] = {}  # per case: None, or its traceback


def run_interpreted(module: str, check: str, cases: list[dict]) -> list[str | None]:
    """Calls module.check(**case) for each case under the Triton interpreter,
    on the CPU, in a child process (a fork of tests/kernels/interpreter_forks.py's):
    TRITON_INTERPRET must be set before triton.jit decorates a kernel, and this process
    imports them compiled. Returns, per case, None if it passed, else its traceback."""
    global _forks
    if _forks is None or _forks.poll() is not None:
        _forks = subprocess.Popen([sys.executable, "-m", "tests.kernels.interpreter_forks"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=ROOT, env={**os.environ, **INTERPRETER_ENV})
    _forks.stdin.write(json.dumps([module, check, cases]) + "\n")
    _forks.stdin.flush()
    line = _forks.stdout.readline()
    assert line, f"the interpreter's process ended (status {_forks.wait()})"
    reply = json.loads(line)
    assert reply["results"] is not None, reply["error"]
    return reply["results"]


def run_cases(module: str, check: str, cases: list[dict]) -> list[str | None]:
    fn = getattr(importlib.import_module(module), check)
    return [_run_case(fn, case) for case in cases]


_forks: subprocess.Popen | None = None  # interpreter_forks.py's process, once started


class _Background:
    """A child process, at the lowest priority, running the interpreted checks of the
    session's tests in the order the tests come: the Triton interpreter is slow and single-
    threaded, and this way it uses the core the other tests leave idle. Each case's result
    goes to a file of its own. A test whose check is not done by then takes over: the
    background stops, the test runs the cases left at full priority, and a new background
    goes on with the later checks."""

    def __init__(self, keys: list[tuple[str, str]]):
        self.keys = keys
        self.folder = Path(tempfile.mkdtemp(prefix="interpreted-"))
        self.process = None
        self._start(0)

    def _start(self, first: int) -> None:
        jobs = [[index, module, check, _CASES[module, check]]
                for index, (module, check) in enumerate(self.keys) if index >= first]
        if not jobs:
            return
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.kernels.common", "--into", str(self.folder)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            text=True, cwd=ROOT, env={**os.environ, **INTERPRETER_ENV}, start_new_session=True)
        self.process.stdin.write(json.dumps(jobs))
        self.process.stdin.close()

    def take(self, key: tuple[str, str]) -> list[str | None]:
        index = self.keys.index(key)
        cases = _CASES[key]
        paths = [self.folder / f"{index}-{i}.json" for i in range(len(cases))]
        if not paths[-1].exists():
            self._stop_process()
            left = [i for i, path in enumerate(paths) if not path.exists()]
            for i, result in zip(left, run_interpreted(*key, [cases[i] for i in left])):
                paths[i].write_text(json.dumps(result))
            self._start(index + 1)
        return [json.loads(path.read_text()) for path in paths]

    def _stop_process(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)  # its check's process too
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        self._stop_process()
        shutil.rmtree(self.folder, ignore_errors=True)


_background: _Background | None = None


def start_in_background(items) -> None:
    """From the session's collected tests: starts their interpreted checks (conftest.py)."""
    global _background
    keys = []
    for item in items:
        key = getattr(getattr(item, "function", None), "interpreted_check", None)
        skipped = any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))
        if key and key not in keys and not skipped:
            keys.append(key)
    if keys:
        _background = _Background(keys)


def stop_background() -> None:
    if _background:
        _background.stop()


def _run_case(fn, case: dict) -> str | None:
    try:
        fn(**case)
    except Exception:
        return traceback.format_exc()
    return None


def _run_jobs(folder: Path) -> None:
    """The background child: each [index, module, check, cases] of stdin's list in order,
    each in a process of its own (as run_interpreted runs one: a check's module state does
    not reach the next), case i's result written to folder/<index>-<i>.json."""
    os.nice(19)  # the tests running meanwhile come first
    session = os.getppid()
    for index, module, check, cases in json.load(sys.stdin):
        if os.getppid() != session:  # the session was killed
            return
        subprocess.run([sys.executable, "-m", "tests.kernels.common", "--job", str(folder),
                        str(index), module, check], input=json.dumps(cases), text=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run_job(folder: Path, index: str, module: str, check: str) -> None:
    fn = getattr(importlib.import_module(module), check)
    driver = os.getppid()
    for i, case in enumerate(json.load(sys.stdin)):
        if os.getppid() != driver:  # the background was stopped
            return
        part = folder / f"{index}-{i}.part"
        part.write_text(json.dumps(_run_case(fn, case)))
        part.rename(folder / f"{index}-{i}.json")


if __name__ == "__main__":
    if sys.argv[1] == "--into":
        _run_jobs(Path(sys.argv[2]))
    elif sys.argv[1] == "--job":
        _run_job(Path(sys.argv[2]), *sys.argv[3:])

