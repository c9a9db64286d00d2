"""A decode step's GEMMs under torch's BLAS choices: cuBLAS, cuBLASLt, and TunableOp's pick.

For each projection of a shape (per rank under --tp) and each row count, the time of
`x @ w.T` in bf16 with several weight copies in turn (each larger than L2 together, as
the layers are in a step), and the matrix rate it reaches. The decode step's GEMMs at
256 rows run at ~0.8 of the matrix rate (docs/benchmark_log.md, twelfth session).

    python3 benchmarks/gemm_backends.py --model benchmarks/shapes/llama-3.1-8b.json \
        --rows 64 256 512 --tp 1 2
"""
import argparse
import json
import os
import tempfile

import torch



def projections(cfg, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection on one of `tp` ranks."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    return {"qkv": ((q + 2 * kv) // tp, hidden), "o": (hidden, q // tp),
            "gate_up": (2 * inter // tp, hidden), "down": (hidden, inter // tp),
            "head": (cfg.vocab_size // tp, hidden)}


def weight_copies(n: int, k: int, copies: int) -> list[torch.Tensor]:
    """`copies` random bf16 [n, k] weights, to take in turn: together past L2, as a step's
    layers are."""
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            for _ in range(copies)]


def rotating_ms(fn, weights: list[torch.Tensor], reps: int) -> float:
    """ms per call of fn(w), the weights taken in turn."""
    for w in weights:
        fn(w)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(reps):
        fn(weights[i % len(weights)])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def measure(shapes, rows_list, reps: int, copies: int) -> dict:
    out = {}
    for name, (n, k) in shapes.items():
        weights = weight_copies(n, k, copies)
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ms = rotating_ms(lambda w: x @ w.T, weights, reps)
            out[f"{name}@{rows}"] = {"ms": round(ms, 4),
                                     "tflops": round(2 * rows * n * k / ms / 1e9, 1)}
        del weights
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--tp", type=int, nargs="+", default=[1])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--backends", nargs="+", default=["cublas", "cublaslt", "tunable"])
    args = parser.parse_args()
    with open(args.model) as f:
        cfg = argparse.Namespace(**json.load(f))
    results = {}
    for tp in args.tp:
        shapes = projections(cfg, tp)
        for backend in args.backends:
            torch.backends.cuda.preferred_blas_library(
                "cublaslt" if backend == "cublaslt" else "cublas")
            if backend == "tunable":
                torch.cuda.tunable.set_filename(os.path.join(tempfile.mkdtemp(), "tuned.csv"))
                torch.cuda.tunable.enable(True)
                torch.cuda.tunable.tuning_enable(True)
            results[f"tp{tp}/{backend}"] = measure(shapes, args.rows, args.reps, args.copies)
            if backend == "tunable":
                # rows of (op, shape, pick, ms, ...): on CUDA (torch 2.11) every pick was Default
                results[f"tp{tp}/tunable_picks"] = [
                    [str(field) for field in entry] for entry in torch.cuda.tunable.get_results()]
                torch.cuda.tunable.enable(False)
            print(json.dumps({f"tp{tp}/{backend}": results[f"tp{tp}/{backend}"]}), flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
