"""sm_90 PTX of fp8_gemv's kernel at the configs the default paths launch, compiled on the CPU.
Usage (worktree root): PYTHONPATH=. python /tmp/c49/ptx_dump.py OUTDIR [runtime|exact]
runtime: the norm tail's scalars (before its removal) as the kernel's parameters, as a launch
without a tail passes their defaults; exact: as constants (so both trees' parameter lists match)."""
import hashlib, inspect, os, sys
from concurrent.futures import ProcessPoolExecutor
import torch
from parashift.kernels import fp8_gemm, fp8_gemv, pdl
from tests.deterministic.test_kernels import compile_sm90

FP8 = torch.float8_e4m3fn
OUT, MODE = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "runtime")
TAIL_CONSTEXPRS = dict(NORM_TAIL=False, TAIL_QUANT=False, TAIL_BLOCK=1, TAIL_CHUNKS=1,
                       TAIL_PREFETCH=1, tr_ptr=None, tnw_ptr=None, to_ptr=None, th_ptr=None,
                       tq_ptr=None, tqs_ptr=None)
TAIL_SCALARS = dict(stride_trm=0, stride_tom=0, stride_thm=0, inv_n=1.0, tail_eps=0.0)


def cases():
    for c in fp8_gemm.GEMV_CONFIGS:
        for rows in (1, 4):
            for even_k in (True, False):
                yield (f"gemv_{c.block_n}x{c.block_k}w{c.num_warps}s{c.split_k}"
                       f"{'_ahead' if c.ahead else ''}{'_tickets' if c.tickets else ''}"
                       f"_r{rows}_{'even' if even_k else 'odd'}", c, rows, even_k, {})
    c = fp8_gemm.GEMV_CONFIGS[0]
    for name, extra in (("gated", dict(GATED=True, LIBDEVICE=True)),
                        ("silu_out", dict(SILU_OUT=True, LIBDEVICE=True)),
                        ("norm_res", dict(NORM=True, HAS_RESIDUAL=True, NORM_BLOCK=2048,
                                          NORM_CHUNKS=2)),
                        ("norm", dict(NORM=True, NORM_BLOCK=2048, NORM_CHUNKS=2)),
                        ("bias", dict(HAS_BIAS=True))):
        for rows in (1, 4):
            yield f"{name}_r{rows}", c, rows, True, extra


def one(case):
    name, c, rows, even_k, extra = case
    params = inspect.signature(fp8_gemv._fp8_gemv_kernel.fn).parameters
    constants = dict(HAS_BIAS=False, ROWS=rows, EVEN_K=even_k, BLOCK_N=c.block_n,
                     BLOCK_K=c.block_k, SPLIT_K=c.split_k, VEC=fp8_gemv.VEC, USE_PDL=pdl.EARLY,
                     PREFETCH_K=0, AHEAD=c.ahead, TICKETS=c.tickets, GATED=False,
                     LIBDEVICE=False, SILU_OUT=False, NORM=False, HAS_RESIDUAL=False,
                     NORM_BLOCK=1, NORM_CHUNKS=1, EVICT_FIRST=True)
    constants.update(extra)
    constants.update({k: v for k, v in TAIL_CONSTEXPRS.items() if k in params})
    if MODE == "exact":
        constants.update({k: v for k, v in TAIL_SCALARS.items() if k in params})
    pointers = {"x_ptr": "bf16", "w_ptr": "fp8e4nv", "s_ptr": "fp32", "b_ptr": "bf16",
                "y_ptr": "bf16", "part_ptr": "fp32", "counter_ptr": "i32", "r_ptr": "bf16",
                "nw_ptr": "bf16", "h_ptr": "bf16"}
    floats = ("inv_k", "eps", "inv_n", "tail_eps")
    ptx = compile_sm90(fp8_gemv._fp8_gemv_kernel, constants, pointers, floats,
                       num_warps=c.num_warps, num_stages=c.num_stages)["ptx"]
    with open(os.path.join(OUT, name + ".ptx"), "w") as f:
        f.write(ptx)
    return name, hashlib.sha256(ptx.encode()).hexdigest()[:16]


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(one, list(cases())))
    with open(os.path.join(OUT, "hashes.txt"), "w") as f:
        for name, h in results:
            f.write(f"{name} {h}\n")
    print(len(results), "kernels")
