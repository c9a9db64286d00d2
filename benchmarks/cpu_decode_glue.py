"""The non-GEMM work of one CPU decode step, op by op, at a model's decode shape (SmolLM2-135M's
by default): the engine's own CPU functions (rotary, norms, SiLU-and-mul, the held contexts'
SDPA, the greedy argmax) timed apart from any engine, each with its count a step, so that
their sum can be set against a step's time outside the GEMMs. Candidates for the attention
are timed beside the engine's grouped SDPA (one query a head with `enable_gqa`; scores and
softmax by two fp32 batched matmuls), each with its largest difference from the engine's.

Usage: python3 benchmarks/cpu_decode_glue.py [--dtype bfloat16] [--batch 16] [--context 96]
  [--threads 2] [--rounds 5] [--calls 200] [--output glue.json]
Each op: --calls calls a round, --rounds rounds interleaved over the ops, the median round."""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from parashift.layers.activation import silu_and_mul_torch
from parashift.layers.layernorm import add_rms_norm_torch, rms_norm_torch
from parashift.layers.rotary import _rotate_swapped
from parashift.layers.sampler import cpu_friendly

SHAPE = dict(hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, layers=30,
             vocab=49152)


def decode_ops(dtype: torch.dtype, batch: int, context: int) -> dict:
    """name -> (callable, calls a decode step)."""
    s, n = SHAPE, SHAPE["layers"]
    h = torch.randn(batch, s["hidden"], dtype=dtype)
    res = torch.randn_like(h)
    w = torch.randn(s["hidden"], dtype=dtype)
    qk = torch.randn(batch, s["heads"] + s["kv_heads"], s["head_dim"], dtype=dtype)
    cos2, sin2 = (torch.randn(batch, 1, s["head_dim"]) for _ in range(2))
    gate_up = torch.randn(batch, 2 * s["intermediate"], dtype=dtype)
    group = s["heads"] // s["kv_heads"]
    q = torch.randn(batch, s["kv_heads"], group, s["head_dim"], dtype=dtype)
    k = torch.randn(batch, s["kv_heads"], context, s["head_dim"], dtype=dtype)
    v = torch.randn_like(k)
    logits = torch.randn(batch, s["vocab"], dtype=dtype)
    scale = s["head_dim"] ** -0.5
    return {
        "rotary (q and k heads)": (lambda: _rotate_swapped(qk, cos2, sin2), n),
        "add + rms_norm": (lambda: add_rms_norm_torch(h, res, w, 1e-5), 2 * n),
        "silu_and_mul": (lambda: silu_and_mul_torch(gate_up), n),
        "sdpa grouped [b, kv, group, d] (engine)": (
            lambda: F.scaled_dot_product_attention(q, k, v, scale=scale), n),
        "sdpa enable_gqa [b, heads, 1, d]": (lambda: sdpa_gqa(q, k, v, scale), 0),
        "attention by fp32 bmm": (lambda: attention_bmm(q, k, v, scale), 0),
        "greedy argmax (the sampler's: fp32 copy first)": (
            lambda: cpu_friendly(logits).argmax(-1), 1),
        "argmax in the logits' dtype": (lambda: logits.argmax(-1), 0),
        "final rms_norm": (lambda: rms_norm_torch(h, w, 1e-5), 1),
    }


def sdpa_gqa(q, k, v, scale):
    b, kv, group, d = q.shape
    o = F.scaled_dot_product_attention(q.reshape(b, kv * group, 1, d), k, v, scale=scale,
                                       enable_gqa=True)
    return o.view(b, kv, group, d)


def attention_bmm(q, k, v, scale):
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(scale)
    return torch.matmul(scores.softmax(-1), v.float()).to(q.dtype)


def timed_round(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--output")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ops = decode_ops(getattr(torch, args.dtype), args.batch, args.context)
    for fn, _ in ops.values():
        timed_round(fn, 10)
    samples = {name: [] for name in ops}
    for _ in range(args.rounds):
        for name, (fn, _) in ops.items():
            samples[name].append(timed_round(fn, args.calls))
    engine = ops["sdpa grouped [b, kv, group, d] (engine)"][0]()
    rows = {}
    for name, (fn, per_step) in ops.items():
        us = statistics.median(samples[name])
        row = {"us_a_call": round(us, 1), "calls_a_step": per_step,
               "ms_a_step": round(us * per_step / 1e3, 3),
               "rounds_us": [round(x, 1) for x in samples[name]]}
        if "attention" in name or "sdpa" in name:
            row["max_diff_vs_engine"] = float((fn().float() - engine.float()).abs().max())
        rows[name] = row
        print(f"{name:42s} {us:9.1f} us x {per_step:3d} = {row['ms_a_step']:7.3f} ms a step")
    total = sum(r["ms_a_step"] for r in rows.values())
    print(f"{'sum (the engine ops)':42s} {total:.3f} ms a step")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "ops": rows, "ms_a_step": round(total, 3),
                       "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
