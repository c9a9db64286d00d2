"""Registers a thread of the FP8 GEMV with the norm tail (kernels/norm_tail.py) against the
plain GEMV, as sm_90a's ptxas allocates them (CPU only: Triton ships ptxas). A kernel's
registers are its peak anywhere, and they bound how many programs an SM holds, so the bytes
in flight of a GEMV streaming its weight; the tail should not raise them.

Usage: PYTHONPATH=. python3 benchmarks/gemv_tail_registers.py [--n 4096] [--columns 256 512]
Prints a JSON line a (config, tail columns a warp): plain, tail, tail with E4M3 rows."""
import argparse
import inspect
import json
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from parashift.kernels import fp8_gemv, norm_tail

# (block_n, block_k, warps, ahead): the one-row configs (fp8_gemm.GEMV_CONFIGS) o takes
CONFIGS = ((4, 2048, 4, True), (4, 1024, 4, True), (8, 1024, 4, True), (4, 1024, 4, False),
           (8, 1024, 4, False), (2, 2048, 4, False), (2, 4096, 8, False))
POINTERS = {"w_ptr": "fp8e4nv", "tq_ptr": "fp8e4nv", "s_ptr": "fp32", "b_ptr": "fp32",
            "part_ptr": "fp32", "counter_ptr": "i32", "tqs_ptr": "fp32"}
FLOATS = ("inv_k", "eps", "inv_n", "tail_eps")


def registers(block_n: int, block_k: int, warps: int, ahead: bool, n: int, tail: bool,
              quant: bool, columns: int) -> int:
    """ptxas's registers a thread of the kernel so configured (bf16 activations, one row)."""
    constants = dict(HAS_BIAS=False, ROWS=1, EVEN_K=True, BLOCK_N=block_n, BLOCK_K=block_k,
                     SPLIT_K=1, VEC=fp8_gemv.VEC, USE_PDL=1, PREFETCH_K=0, AHEAD=ahead,
                     TICKETS=False, GATED=False, LIBDEVICE=False, SILU_OUT=False, NORM=False,
                     HAS_RESIDUAL=False, NORM_BLOCK=1, NORM_CHUNKS=1, EVICT_FIRST=True,
                     NORM_TAIL=tail, TAIL_QUANT=quant,
                     TAIL_BLOCK=min(columns * warps, triton.next_power_of_2(n)),
                     TAIL_CHUNKS=triton.cdiv(n, min(columns * warps, triton.next_power_of_2(n))),
                     TAIL_PREFETCH=triton.next_power_of_2(n))
    signature = {}
    for name in inspect.signature(fp8_gemv._fp8_gemv_kernel.fn).parameters:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*" + POINTERS.get(name, "bf16")
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    # as a launch on the 8B's tensors specializes: pointers 16-byte aligned, the sizes and
    # strides multiples of 16
    aligned = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values())
               if kind.startswith("*") or kind == "i32"}
    source = ASTSource(fp8_gemv._fp8_gemv_kernel, signature, constexprs=constants,
                       attrs=aligned)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": warps, "launch_pdl": True}).asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "ptxas-blackwell")  # Triton's newest: its PTX's version
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                              capture_output=True, text=True, check=True)
    return int(re.search(r"Used (\d+) registers", done.stderr).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="the output row's width (o: 4,096)")
    p.add_argument("--columns", type=int, nargs="+",
                   default=[norm_tail.TAIL_COLUMNS_PER_WARP],
                   help="the tail's columns a warp a chunk")
    args = p.parse_args()
    for columns in args.columns:
        for block_n, block_k, warps, ahead in CONFIGS:
            counts = [registers(block_n, block_k, warps, ahead, args.n, tail, quant, columns)
                      for tail, quant in ((False, False), (True, False), (True, True))]
            print(json.dumps(dict(config=f"{block_n}x{block_k} w{warps}"
                                  f"{' ahead' if ahead else ''}", columns=columns,
                                  plain=counts[0], tail=counts[1], tail_fp8=counts[2])),
                  flush=True)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
