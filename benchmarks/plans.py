"""Static plans side by side on one machine: the `interactive` workload's TTFT and
TPOT and the `batch` workload's combined throughput (../shared/workloads.md),
in process (no HTTP), random weights.

Usage (2 GPUs): python3 benchmarks/plans.py --model benchmarks/shapes/llama-3.1-8b.json \
    --plans single tp2 dp2 sp2 pp2 shift2 --interactive-requests 20 --batch-requests 1000
A plan is `single` or degrees joined, e.g. tp8, dp4tp2, sp4tp2; `shift-` before one runs
the shift policy over it as base plan (shift-sp8, shift-sp4tp2; shift2 = shift-sp2).
A plan that fails (one whose weights do not fit, say) gets {"plan": ..., "error": ...} as its
row, and the next plan runs."""
import argparse
import gc
import json
import random
import re
import statistics
import time

import torch

from parashift import LLM, SamplingParams

DEGREES = {"dp": "data_parallel_size", "tp": "tensor_parallel_size",
           "sp": "sequence_parallel_size", "pp": "pipeline_parallel_size"}
ALIASES = {"shift2": "shift-sp2"}


def plan_options(name: str) -> dict:
    """Engine options of a plan name (see the module docstring); "layout:SPEC" starts the
    node in that layout (e.g. layout:merge2-tp2, two full replicas run as TP=2)."""
    if name.startswith("layout:"):
        return {"layout": name.removeprefix("layout:")}
    name = ALIASES.get(name, name)
    body = name.removeprefix("shift-")
    degrees = re.findall(r"(dp|tp|sp|pp)(\d+)", body)
    if body != "single" and "".join(kind + size for kind, size in degrees) != body:
        raise ValueError(f"plan {name!r}: use single or degrees like dp4tp2, optionally shift-")
    options = {DEGREES[kind]: int(size) for kind, size in degrees}
    return {**options, "parallel_policy": "shift"} if name.startswith("shift-") else options


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def warm_up(llm: LLM, input_len: int, vocab: int) -> None:
    """Compiles the kernels a mixed batch needs before anything is timed."""
    rng = random.Random(2)
    llm.generate([random_prompt(rng, input_len, vocab) for _ in range(8)],
                 SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))


def interactive(llm: LLM, n: int, input_len: int, output_len: int, vocab: int) -> dict:
    """One request at a time; TTFT and mean time per output token after the first."""
    engine, rng = llm.llm_engine, random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    ttfts, tpots, prompt_steps = [], [], []
    for i in range(n):
        engine.take_step_records()
        start = time.perf_counter()
        engine.add_request(f"i{i}", random_prompt(rng, input_len, vocab), params)
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter()
        end = time.perf_counter()
        # the prompt's steps' own seconds (every step with more tokens than sequences)
        prompt_steps.append(sum(r.seconds for r in engine.take_step_records() if r.num_tokens > 1))
        ttfts.append(first - start)
        tpots.append((end - first) / (output_len - 1))
    return dict(ttft_ms_median=1e3 * statistics.median(ttfts),
                tpot_ms_median=1e3 * statistics.median(tpots),
                ttft_ms=[round(1e3 * t, 2) for t in ttfts],
                prompt_step_ms=[round(1e3 * t, 2) for t in prompt_steps])


def batch(llm: LLM, n: int, input_len: int, output_len: int, vocab: int) -> dict:
    rng = random.Random(1)
    prompts = [random_prompt(rng, input_len, vocab) for _ in range(n)]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return dict(batch_seconds=elapsed,
                combined_tokens_per_s=n * (input_len + output_len) / elapsed)


def run_plan(name: str, options: dict, args) -> dict:
    """One plan's row; a plan that fails (to start: its weights do not fit, say) gets its
    error in its row (with what it measured before), and the next plan still runs."""
    llm, row = None, dict(plan=name)
    try:
        start = time.perf_counter()
        llm = LLM(model=args.model, dtype="bfloat16", skip_tokenizer_init=True,
                  max_model_len=args.input_len + args.output_len + 16, max_num_seqs=256,
                  enable_prefix_caching=False, device=args.device, **options,
                  cuda_graphs=args.cuda_graphs)
        row["startup_s"] = time.perf_counter() - start
        vocab = llm.llm_engine.vocab_size
        warm_up(llm, args.input_len, vocab)
        row.update(interactive(llm, args.interactive_requests, args.input_len, args.output_len,
                               vocab))
        row.update(batch(llm, args.batch_requests, args.input_len, args.output_len, vocab))
    except Exception as e:  # noqa: BLE001 - one plan must not lose the others
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        if llm is not None:
            try:
                llm.llm_engine.shutdown()
            except Exception as e:  # noqa: BLE001 - its workers already gone
                row.setdefault("error", f"shutdown: {type(e).__name__}: {e}"[:2000])
        del llm  # free this plan's GPU memory before the next plan sizes its KV pool
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--plans", nargs="+", default=["single", "tp2", "dp2", "sp2", "shift2"])
    p.add_argument("--interactive-requests", type=int, default=20)
    p.add_argument("--batch-requests", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=4096)
    p.add_argument("--output-len", type=int, default=250)
    p.add_argument("--shift-threshold", type=int, default=None)
    p.add_argument("--shift-weights", choices=["reorder", "separate", "slice"], default=None)
    p.add_argument("--merge-weights", choices=["reorder", "view", "materialize"], default=None,
                   help="the weights of layout:merge... plans (default: the engine's, reorder)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on where possible (CUDA, triton attention)")
    p.add_argument("--moe-parallel", choices=["tp", "ep"], default=None,
                   help="a mixture of experts' split (default: the engine's, tp)")
    p.add_argument("--pp-micro-batch-tokens", type=int, default=None,
                   help="least tokens of a pipelined step's micro-batch (engine default)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu (the CPU check)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    plans = {name: plan_options(name) for name in args.plans}
    for options in plans.values():
        if options.get("parallel_policy") == "shift":
            for name in ("shift_threshold", "shift_weights"):
                if getattr(args, name) is not None:
                    options[name] = getattr(args, name)
        if args.pp_micro_batch_tokens is not None:
            options["pp_micro_batch_tokens"] = args.pp_micro_batch_tokens
        if "merge" in options.get("layout", "") and args.merge_weights is not None:
            options["merge_weights"] = args.merge_weights
        if args.moe_parallel is not None:
            options["moe_parallel"] = args.moe_parallel
    rows = []
    for name, options in plans.items():
        row = run_plan(name, options, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(model=args.model, args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
