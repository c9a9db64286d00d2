"""What `torch.compile` (inductor, CPU) would cost and gain on a SmolLM2-shaped decode step:
a stand-in of the model's dense part (per layer: residual add and RMSNorm, the QKV GEMM,
rotary on q and k, the o GEMM, add and RMSNorm, gate_up, SiLU-and-mul, down; attention
left out: the engine's paged attention is not traced here) on random weights, eager against
compiled, and the compile's seconds with an empty inductor cache (a newcomer's first run)
and again with the cache the first left (a later run).

Usage: python3 benchmarks/cpu_compile_cost.py [--dtype float32] [--rows 1] [--threads 2]
  [--layers 30] [--output compile.json]
Each figure is the best of 5 timed loops of 20 steps. The compile runs in a child process
each time (so the second finds only the on-disk cache), with TORCHINDUCTOR_CACHE_DIR set to
a fresh directory for the first."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 576, 9, 3, 64, 1536


def make_weights(layers: int, dtype: torch.dtype) -> list[dict]:
    gen = torch.Generator().manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)
    qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    return [{"qkv": w(qkv_out, HIDDEN), "o": w(HIDDEN, HEADS * HEAD_DIM),
             "gate_up": w(2 * FFN, HIDDEN), "down": w(HIDDEN, FFN),
             "n1": torch.ones(HIDDEN, dtype=dtype), "n2": torch.ones(HIDDEN, dtype=dtype)}
            for _ in range(layers)]


def rms(x, weight):
    return weight * F.rms_norm(x.float(), weight.shape, None, 1e-5).to(x.dtype)


def dense_step(x, residual, cos2, sin2, weights):
    for layer in weights:
        residual = x + residual
        h = rms(residual, layer["n1"])
        qkv = F.linear(h, layer["qkv"]).unflatten(-1, (-1, HEAD_DIM))
        qk = qkv[:, :HEADS + KV_HEADS].float()
        swapped = qk.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
        qk = (qk * cos2 + swapped * sin2).to(x.dtype)
        x = F.linear(qk[:, :HEADS].flatten(-2), layer["o"])  # attention left out
        residual = x + residual
        h = rms(residual, layer["n2"])
        gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
        x = F.linear(F.silu(gate) * up, layer["down"])
    return x, residual


def best_ms(fn, args, loops: int = 5, steps: int = 20) -> float:
    for _ in range(3):
        fn(*args)
    best = float("inf")
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(steps):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / steps)
    return best * 1e3


def inputs(args, dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.rows, HIDDEN, generator=gen).to(dtype)
    cos2 = torch.randn(args.rows, 1, HEAD_DIM, generator=gen)
    return x, x.clone(), cos2, cos2.clone(), make_weights(args.layers, dtype)


def child(args) -> dict:
    """Compile and time in this process: {compile_s, compiled_ms}."""
    torch.set_num_threads(args.threads)
    step_args = inputs(args, getattr(torch, args.dtype))
    compiled = torch.compile(dense_step, dynamic=False)
    start = time.perf_counter()
    with torch.inference_mode():
        compiled(*step_args)
        compile_s = time.perf_counter() - start
        return {"compile_s": round(compile_s, 2), "compiled_ms": round(best_ms(compiled,
                                                                               step_args), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        eager = best_ms(dense_step, inputs(args, getattr(torch, args.dtype)))
    out = {"dtype": args.dtype, "rows": args.rows, "threads": args.threads,
           "layers": args.layers, "eager_ms": round(eager, 3)}
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--dtype", args.dtype,
            "--rows", str(args.rows), "--threads", str(args.threads),
            "--layers", str(args.layers)]
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        for run in ("cold", "warm"):
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode:
                out[run] = {"error": done.stderr.strip().splitlines()[-1:]}
            else:
                out[run] = json.loads(done.stdout.strip().splitlines()[-1])
            print(run, out[run], flush=True)
    print(json.dumps(out))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
