"""The sampler's argmax over the 8B model's vocabulary on one GPU: torch's against
kernels/argmax.py, bf16 logits, µs per call (triton's do_bench, median) at each batch.

Usage (GPU): PYTHONPATH=. python3 benchmarks/argmax.py [--rows 1 64 256] [--vocab 128256]
    [--output F]"""
import argparse
import json

import torch
import triton.testing

from parashift.kernels import argmax


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    results = []
    for rows in args.rows:
        logits = torch.randn(rows, args.vocab, device="cuda", dtype=torch.bfloat16)
        same = torch.equal(argmax.argmax(logits), logits.argmax(dim=-1))
        bench = {name: 1e3 * triton.testing.do_bench(fn, warmup=10, rep=100,
                                                     return_mode="median")
                 for name, fn in (("torch_us", lambda: logits.argmax(dim=-1)),
                                  ("kernel_us", lambda: argmax.argmax(logits)))}
        results.append(dict(rows=rows, vocab=args.vocab, same=same,
                            **{k: round(v, 2) for k, v in bench.items()}))
        print(json.dumps(results[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=results), f, indent=1)


if __name__ == "__main__":
    main()
