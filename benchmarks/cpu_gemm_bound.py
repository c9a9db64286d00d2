"""The most the CPU engine can gain over transformers `generate` on the embedded SmolLM2 where
its GEMMs run at their speed in place and everything else costs nothing: the GEMMs of a
`generate` (one prompt forward, then one decode forward a new token after the first), each
timed as a sweep over every weight in the model's order (as a forward reads them: from memory
where the model outgrows the last-level cache), against the whole `generate` measured.

Usage: python3 benchmarks/cpu_gemm_bound.py --dtype float32 --batch 1 [--threads 2]
  [--prompt-len 64] [--new-tokens 64] [--repeats 3] [--deadline-s S] [--output bound.json]
Sweeps (ms, medians of --repeats, interleaved): `engine_decode` / `engine_prompt`: the
engine's linear layers and LM head through their `matmul` (the start-up routes,
layers/cpu_packed.py) at the batch's rows / the prompts' rows (the LM head at the batch's
rows: both compute the last position's logits only); `plain_*`: the same weights by
`F.linear`; `transformers_*`: transformers' own `nn.Linear`s (q, k, v, gate, up apart) by
`F.linear`. `generate_s`: each engine's whole `generate` (medians, interleaved); the bound
is transformers' `generate_s` over the engine's GEMM seconds of a `generate`
(engine_prompt + (new_tokens - 1) x engine_decode). `engine_gemm_s_inside_a_generate`: the
same GEMMs timed call by call inside one more engine `generate` (where the steps' other work
runs between them), against the sweeps' figure."""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.cpu_generate import load_transformers, parashift_run, prompts_of, transformers_run
from parashift import LLM
from parashift.layers.cpu_packed import packable_layers


def engine_gemms(model) -> list:
    """(call, weight) of each engine GEMM in the model's order (the LM head last)."""
    return [(m.matmul, m.weight) for m in packable_layers(model)]


def gemm_seconds_in_place(model, run) -> float:
    """Seconds the engine's GEMMs take inside `run()` (a generate): each layer's `matmul`
    wrapped by a timer for the run (a perf_counter pair a call)."""
    layers, total = packable_layers(model), [0.0]

    def timed(call):
        def wrapper(*args):
            start = time.perf_counter()
            out = call(*args)
            total[0] += time.perf_counter() - start
            return out
        return wrapper
    originals = [m.matmul for m in layers]
    for m in layers:
        m.matmul = timed(m.matmul)
    try:
        run()
    finally:
        for m, original in zip(layers, originals):
            m.matmul = original
    return total[0]


def transformers_gemms(model) -> list:
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return [(F.linear, m.weight) for m in linears]


def sweep_ms(gemms: list, rows: int, head_rows: int) -> float:
    """One pass of the GEMMs at `rows` (the last one, the LM head, at `head_rows`)."""
    inputs = {}
    start = time.perf_counter()
    for i, (call, weight) in enumerate(gemms):
        n = head_rows if i == len(gemms) - 1 else rows
        key = (n, weight.shape[1], weight.dtype)
        if key not in inputs:  # made once a shape: outside the timed calls after the first
            pause = time.perf_counter()
            inputs[key] = torch.randn(n, weight.shape[1]).to(weight.dtype)
            start += time.perf_counter() - pause
        call(inputs[key], weight, None)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deadline-s", type=float, default=float("inf"),
                        help="no repeat after the first begins this long after the start")
    parser.add_argument("--output")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    llm = LLM(device="cpu", dtype=args.dtype, attention_backend="torch",
              enable_prefix_caching=False, max_model_len=1024, max_num_seqs=args.batch)
    hf = load_transformers(dtype)
    engine = engine_gemms(llm.llm_engine.runner.model)
    sweeps = {"engine": engine, "plain": [(F.linear, w) for _, w in engine],
              "transformers": transformers_gemms(hf)}
    runs = {"parashift": parashift_run(llm), "transformers": transformers_run(hf)}
    prompts = prompts_of(args.batch, args.prompt_len)
    rows = {"decode": (args.batch, args.batch),
            "prompt": (args.batch * args.prompt_len, args.batch)}
    samples: dict[str, list[float]] = {}
    with torch.inference_mode():
        for run in runs.values():
            run(prompts, 4)  # warm-up (the engine's routes made their primitives)
        for repeat in range(args.repeats):
            if repeat and time.perf_counter() - started > args.deadline_s:
                break
            for name, gemms in sweeps.items():
                for kind, r in rows.items():
                    samples.setdefault(f"{name}_{kind}", []).append(sweep_ms(gemms, *r))
            order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]
            for name in order:
                start = time.perf_counter()
                runs[name](prompts, args.new_tokens)
                samples.setdefault(f"{name}_generate_s", []).append(time.perf_counter() - start)
        in_step_s = gemm_seconds_in_place(llm.llm_engine.runner.model,
                                          lambda: runs["parashift"](prompts, args.new_tokens))
    medians = {k: round(statistics.median(v), 4) for k, v in samples.items()}
    decodes = args.new_tokens - 1
    gemm_s = {name: (medians[f"{name}_prompt"] + decodes * medians[f"{name}_decode"]) / 1e3
              for name in sweeps}
    tf_s = medians["transformers_generate_s"]
    doc = {"dtype": args.dtype, "batch": args.batch, "threads": args.threads,
           "repeats": len(samples["transformers_generate_s"]),
           "cpus": sorted(__import__("os").sched_getaffinity(0)),
           "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "medians": medians,
           "runs": {k: [round(x, 4) for x in v] for k, v in samples.items()},
           "gemm_s_a_generate": {k: round(v, 4) for k, v in gemm_s.items()},
           "engine_gemm_s_inside_a_generate": round(in_step_s, 4),
           "now_x_transformers": round(tf_s / medians["parashift_generate_s"], 3),
           "bound_x_transformers": round(tf_s / gemm_s["engine"], 3),
           "bound_x_transformers_plain_gemms": round(tf_s / gemm_s["plain"], 3),
           "transformers_gemm_share": round(gemm_s["transformers"] / tf_s, 3),
           "engine_gemm_share": round(gemm_s["engine"] / medians["parashift_generate_s"], 3),
           "routes": llm.llm_engine.runner.cpu_gemm.describe()}
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
