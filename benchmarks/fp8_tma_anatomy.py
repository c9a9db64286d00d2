"""Where the FP8 x FP8 TMA GEMM's time goes at 64 rows (issue 60): the chosen tiling of each
8B projection taken apart, step by step, in the decode chain.

Usage (GPU): PYTHONPATH=. python3 benchmarks/fp8_tma_anatomy.py [--rows 64]
    [--projections qkv o gate_up down] [--output F]

For each projection, on the tiling `fp8_gemm.linear` chose at 64 rows in session 45-46
(`TILINGS`: weight rows a tile, K step, warps, stages, K split), kernels that do more and more
of the GEMM's work on the same grid and pipeline: "w" streams only the weight's tiles by TMA
(XOR of the bytes), "w+x" the tokens' tiles beside them, "dot" multiplies them (wgmma) and
stores the fp32 tile (each K split its own part: no tickets); "engine" is
`fp8_gemm.fp8_weight_linear` itself on that config (scales, the split's tickets, bf16 out), x
in E4M3 as the fused norms hand it over. Beside them read_ceiling's best read-only kernel for
the weight ("read-only, best tile"). At gate_up also: the engine's SiLU·mul with FP8 rows on
its output ("silu_fp8 after"), and gate_up with SiLU·mul in its epilogue ("gated", each
program a gate tile and its up tile, the bf16 product rounded as silu_and_mul rounds) with
the per-token quantization that down would then need ("quantize after gated"). Timed as the
GEMM choice times (`gemm_timing`'s chain: PDL on, each call after a kernel writing its input,
over copies of the weight past L2); µs a call, and the weight's bytes over the time over the
copy bandwidth (for the SiLU·mul and quantization kernels: the gate_up weight's, unread)."""
import argparse

import torch
import triton
import triton.language as tl

from benchmarks import pdl_chain, read_ceiling
from benchmarks.fp8_gemm_sweep import PROJECTIONS, copy_bandwidth
from parashift.kernels import fp8_gemm, fp8_gemm_tma, gemm_timing, pdl, silu_mul
from parashift.kernels.fp8_gemm import Config
from parashift.kernels.silu_values import silu_mul_values

# (block_n, block_k, warps, stages, split): the 64-row choices (docs/benchmark_log.md, fp8b64)
TILINGS = {"qkv": (64, 256, 4, 5, 1), "o": (64, 256, 4, 6, 1), "gate_up": (256, 128, 8, 4, 1),
           "down": (64, 256, 4, 5, 2)}
STAGES = ("w", "w+x", "dot")
# gate_up with SiLU·mul inside: (gate rows a program, and as many up rows; K step, warps,
# stages): 112 programs as the 256x128 tiling, or 224
GATED_TILINGS = ((128, 128, 8, 4), (128, 128, 8, 3), (64, 128, 4, 4), (64, 256, 4, 3))
READ_ONLY = (("regs", 4, 2048, 4, 1, "ahead"), ("regs", 8, 2048, 8, 1, "ahead"),
             ("regs", 8, 1024, 4, 1, "ahead"))


@triton.jit
def _anatomy_kernel(x_desc, w_desc, out_ptr, K, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                    LOAD_X: tl.constexpr, DOT: tl.constexpr, USE_PDL: tl.constexpr):
    first_n = tl.program_id(0) * BLOCK_N
    first_m = tl.program_id(1) * BLOCK_M
    split = tl.program_id(2)
    k_steps = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K)
    pdl.start(USE_PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    w_bits = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.uint8)
    x_bits = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.uint8)
    for step in tl.range(split * k_steps, tl.minimum((split + 1) * k_steps, tl.cdiv(K, BLOCK_K)),
                         num_stages=NUM_STAGES):
        w = w_desc.load([first_n, step * BLOCK_K])
        if DOT:
            acc = tl.dot(w, tl.trans(x_desc.load([first_m, step * BLOCK_K])), acc)
        else:
            w_bits ^= w.to(tl.uint8, bitcast=True)
            if LOAD_X:
                x_bits ^= x_desc.load([first_m, step * BLOCK_K]).to(tl.uint8, bitcast=True)
    program = (split * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) \
        + tl.program_id(0)
    if DOT:
        offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        tl.store(out_ptr + program.to(tl.int64) * BLOCK_N * BLOCK_M + offs, acc)
    else:
        bits = tl.xor_sum(tl.xor_sum(w_bits, axis=1), axis=0) \
            ^ tl.xor_sum(tl.xor_sum(x_bits, axis=1), axis=0)
        tl.store(out_ptr + program, bits.to(tl.float32))


@triton.jit
def _gated_kernel(x_desc, w_desc, s_ptr, xs_ptr, y_ptr, K, HALF, BLOCK_N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                  LIBDEVICE: tl.constexpr, USE_PDL: tl.constexpr):
    """gate_up with SiLU·mul in its epilogue: a program's gate rows and the same up rows
    (HALF further), the two products rounded to bf16 as the GEMM stores them, then
    silu(gate) * up rounded as silu_and_mul rounds; y [M, HALF] bf16."""
    first_n = tl.program_id(0) * BLOCK_N
    pdl.start(USE_PDL)
    gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=NUM_STAGES):
        x = tl.trans(x_desc.load([0, step * BLOCK_K]))
        gate = tl.dot(w_desc.load([first_n, step * BLOCK_K]), x, gate)
        up = tl.dot(w_desc.load([HALF + first_n, step * BLOCK_K]), x, up)
    offs_n = first_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    x_scale = tl.load(xs_ptr + offs_m)[None, :]
    gate = (gate * tl.load(s_ptr + offs_n)[:, None] * x_scale).to(tl.bfloat16)
    up = (up * tl.load(s_ptr + HALF + offs_n)[:, None] * x_scale).to(tl.bfloat16)
    out = silu_mul_values(gate, up, LIBDEVICE).to(tl.bfloat16)
    tl.store(y_ptr + offs_m[None, :] * HALF + offs_n[:, None], out)


def gated(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
          y: torch.Tensor, block_n: int, block_k: int, warps: int, stages: int) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor
    (m, k), half = xq.shape, weight.shape[0] // 2
    x_desc = TensorDescriptor(xq, [m, k], [xq.stride(0), 1], [m, block_k])
    w_desc = TensorDescriptor(weight, [2 * half, k], [weight.stride(0), 1], [block_n, block_k])
    _gated_kernel[(triton.cdiv(half, block_n),)](
        x_desc, w_desc, scale.reshape(-1), x_scale.reshape(-1), y, k, half, BLOCK_N=block_n,
        BLOCK_M=m, BLOCK_K=block_k, NUM_STAGES=stages, LIBDEVICE=xq.is_cuda,
        num_warps=warps, **pdl.launch_options(xq.device))


def anatomy(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, tiling: tuple,
            stage: str) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor
    block_n, block_k, warps, stages, split = tiling
    (m, k), n = x.shape, weight.shape[0]
    bm = fp8_gemm_tma.block_m(m)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [bm, block_k])
    w_desc = TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [block_n, block_k])
    _anatomy_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, bm), split)](
        x_desc, w_desc, out, k, BLOCK_N=block_n, BLOCK_M=bm, BLOCK_K=block_k, SPLIT_K=split,
        NUM_STAGES=stages, LOAD_X=stage != "w", DOT=stage == "dot", num_warps=warps,
        **pdl.launch_options(x.device))


def measure(name: str, rows: int, bandwidth: float) -> dict:
    n, k = PROJECTIONS[name]
    tiling = TILINGS[name]
    x, weight, scale = _operands(rows, n, k)
    xq, x_scale = fp8_gemm.quantize_rows(x)
    weights = gemm_timing.weight_copies(weight)
    out = torch.empty(tiling[4] * rows * n + (1 << 16), dtype=torch.float32, device="cuda")
    config = Config("tma_w8a8", *tiling, tickets=True)
    runs = {stage: lambda i, s=stage: anatomy(xq, weights[i], out, tiling, s) for stage in STAGES}
    runs["engine"] = lambda i: fp8_gemm.fp8_weight_linear(x, weights[i], scale, None, config,
                                                          (xq, x_scale))
    for c in READ_ONLY:
        runs[c] = lambda i, c=c: read_ceiling.read(weights[i].view(torch.uint8), out, *c)
    if name == "gate_up":  # the engine's SiLU·mul (FP8 rows) after it, or SiLU·mul inside it
        products = fp8_gemm.fp8_weight_linear(x, weight, scale, None, config, (xq, x_scale))
        runs["silu_fp8 after"] = lambda i: silu_mul.silu_and_mul_fp8(products)
        activated = torch.empty(rows, n // 2, dtype=torch.bfloat16, device="cuda")
        for tile in GATED_TILINGS:
            runs[("gated",) + tile] = lambda i, t=tile: gated(xq, x_scale, weights[i], scale,
                                                              activated, *t)
        runs["quantize after gated"] = lambda i: fp8_gemm.quantize_rows(activated)
    row = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    timings = gemm_timing.replayed_timings_ms(runs, len(weights), (row, row.clone()))
    read_only = min((t, c) for c, t in timings.items()
                    if isinstance(c, tuple) and c[0] != "gated")
    result = {str(stage): _entry(timings[stage], n * k, bandwidth) for stage in (*STAGES, "engine")
              if stage in timings}
    result["read-only, best tile"] = dict(config=" ".join(map(str, read_only[1])),
                                          **_entry(read_only[0], n * k, bandwidth))
    extra = [c for c in timings if c in ("silu_fp8 after", "quantize after gated")
             or isinstance(c, tuple) and c[0] == "gated"]
    result.update({" ".join(map(str, c)) if isinstance(c, tuple) else c:
                   _entry(timings[c], n * k, bandwidth) for c in extra})
    del weights
    torch.cuda.empty_cache()
    return dict(projection=name, rows=rows, tiling=" ".join(map(str, tiling)), **result)


def _operands(rows: int, n: int, k: int):
    weight = (torch.randn(n, k, device="cuda") * 0.05).to(fp8_gemm.FP8)
    scale = torch.rand(n, device="cuda") * 0.01 + 0.001
    return torch.randn(rows, k, device="cuda", dtype=torch.bfloat16), weight, scale


def _entry(ms: float, nbytes: int, bandwidth: float) -> dict:
    return dict(us=round(1e3 * ms, 2), of_copy=round(nbytes / (ms * 1e-3) / bandwidth, 3))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--projections", nargs="+", default=list(TILINGS), choices=list(TILINGS))
    p.add_argument("--output", default=None)
    args = p.parse_args()
    bandwidth = copy_bandwidth()
    results = []
    for name in args.projections:
        results.append(measure(name, args.rows, bandwidth))
        pdl_chain.report(results, bandwidth, args.output)


if __name__ == "__main__":
    main()
