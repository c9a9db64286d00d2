"""Seesaw against static plans on the offline workloads `summarize` and `chat`
(../shared/workloads.md; parashift/bench/workloads.py), in process, random weights:
each row's throughput, and for seesaw its transition count and costs (weight and KV bytes
moved, exposed stall) and its seconds in prefill, decode, transition and idle.

Usage (2 GPUs, the issue's runs; from the repository root):
  PYTHONPATH=. python3 benchmarks/seesaw.py --model benchmarks/shapes/llama-3.1-8b.json \
      --plans tp2 pp2 dp2 seesaw:pp2-tp2 --workloads summarize chat --cpu-kv-gib 64 \
      --output seesaw-h200x2.json
A plan is `single` or degrees joined (tp2, dp2, pp2; benchmarks/plans.py), or
`seesaw:PREFILL-DECODE` (seesaw:pp2-tp2, seesaw:pp2xtp2-tp4; dpNx before it: N groups of
it, e.g. dp2xseesaw:pp2-tp2 on four GPUs), or `auto` / `auto:N`
(--prefill-plan auto: the cost model picks a pair or a static plan per workload, from the
workload's mean lengths and its number of requests; the row names its choice, the log its
table). `--length-scale` and
`--num-requests` shrink a workload (the CPU check below). `--random-checkpoint DIR` writes
the shape's random weights there once as safetensors and runs from them (the same weights
under every plan). Without it a switch still takes its weights from peers
(`--seesaw-weight-source`, default auto): the running plan's random draw stands for the
checkpoint (worker/peer_weights.py)."""
import argparse
import gc
import json
import logging
import random
import re
import time

import torch

from parashift import LLM, SamplingParams
from parashift.config import SEESAW_WEIGHT_SOURCES
from parashift.bench.workloads import WorkloadOptions, get_workload, sample_lengths
from plans import plan_options  # benchmarks/plans.py (this folder is on sys.path)
from random_checkpoint import random_checkpoint


def is_auto(name: str) -> bool:
    return name == "auto" or name.startswith("auto:")


def engine_options(name: str, args, workload: str | None = None) -> dict:
    """Engine options of a plan name; a seesaw plan takes the tier's size from the flags, auto
    the workload's mean lengths too."""
    groups, _, pair = name.partition("xseesaw:")
    if pair and re.fullmatch(r"dp\d+", groups):
        return dict(engine_options(f"seesaw:{pair}", args, workload),
                    data_parallel_size=int(groups[2:]))
    if not name.startswith("seesaw:") and not is_auto(name):
        return plan_options(name)
    tier = ({"cpu_kv_tokens": args.cpu_kv_tokens} if args.cpu_kv_tokens is not None
            else {"cpu_kv_gib": args.cpu_kv_gib})
    seesaw = dict(parallel_policy="seesaw", seesaw_max_prefill_ms=args.seesaw_max_prefill_ms,
                  seesaw_resident_weights=args.seesaw_resident_weights,
                  seesaw_weight_source=args.seesaw_weight_source, **tier)
    if is_auto(name):
        prompt, output = mean_lengths(workload, args)
        return dict(prefill_plan=name, seesaw_mean_prompt_tokens=prompt,
                    seesaw_mean_output_tokens=output,
                    seesaw_num_requests=len(workload_lengths(workload, args)), **seesaw)
    prefill, _, decode = name.removeprefix("seesaw:").partition("-")
    return dict(prefill_plan=prefill, decode_plan=decode, **seesaw)


def mean_lengths(workload: str, args) -> tuple[int, int]:
    lengths = workload_lengths(workload, args)
    return (round(sum(inp for inp, _ in lengths) / len(lengths)),
            round(sum(out for _, out in lengths) / len(lengths)))


def workload_lengths(workload: str, args) -> list[tuple[int, int]]:
    options = WorkloadOptions(seed=0, num_requests=args.num_requests,
                              length_scale=args.length_scale)
    spec = get_workload(workload)
    return [(int(inp), int(out)) for inp, out in
            sample_lengths(spec, options.num_requests or spec.num_requests, options)]


def chosen_plan(config) -> str:
    """What an engine runs, after auto's choice."""
    if config.parallel_policy == "seesaw":
        groups = f"dp{config.data_parallel_size}x" if config.data_parallel_size > 1 else ""
        return f"{groups}seesaw:{config.seesaw.prefill_plan}-{config.seesaw.decode_plan}"
    return (f"dp{config.data_parallel_size}xpp{config.pipeline_parallel_size}"
            f"xtp{config.tensor_parallel_size}")


def requests(workload: str, args, vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    lengths = workload_lengths(workload, args)
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(inp)] for inp, _ in lengths]
    params = [SamplingParams(temperature=0, max_tokens=out, ignore_eos=True) for _, out in lengths]
    return prompts, params


def transition_costs(records) -> dict:
    seesaw = [r for r in records if r.direction]
    return dict(transitions=len(records),
                weight_gib=sum(r.weight_bytes for r in seesaw) / 2**30,
                weight_s=sum(r.weight_s for r in seesaw),
                weight_peer_gib=sum(r.weight_peer_bytes for r in seesaw) / 2**30,
                weight_host_gib=sum(r.weight_host_bytes for r in seesaw) / 2**30,
                kv_out_gib=sum(r.kv_bytes_out for r in seesaw) / 2**30,
                kv_in_gib=sum(r.kv_bytes_in for r in seesaw) / 2**30,
                drain_s=sum(r.drain_s for r in records), stall_s=sum(r.stall_s for r in records))


def run(llm: LLM, workload: str, args) -> dict:
    engine = llm.llm_engine
    prompts, params = requests(workload, args, engine.vocab_size)
    llm.generate(prompts[:2], [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)] * 2)
    engine.take_transition_records()
    engine.take_phase_seconds()
    start = time.perf_counter()
    llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(map(len, prompts)) + sum(p.max_tokens for p in params)
    row = dict(workload=workload, requests=len(prompts), seconds=elapsed,
               tokens_per_s=tokens / elapsed,
               output_tokens_per_s=sum(p.max_tokens for p in params) / elapsed)
    row.update(transition_costs(engine.take_transition_records()))
    if engine.seesaw:
        row["phase_s"] = engine.take_phase_seconds()
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--plans", nargs="+", default=["tp2", "pp2", "dp2", "seesaw:pp2-tp2"])
    p.add_argument("--workloads", nargs="+", default=["summarize", "chat"],
                   choices=["summarize", "chat"])
    p.add_argument("--num-requests", type=int, default=None, help="default: the workload's")
    p.add_argument("--length-scale", type=float, default=1.0)
    p.add_argument("--cpu-kv-gib", type=float, default=64.0)
    p.add_argument("--cpu-kv-tokens", type=int, default=None, help="instead of --cpu-kv-gib")
    p.add_argument("--seesaw-max-prefill-ms", type=float, default=0.0)
    p.add_argument("--seesaw-resident-weights", action="store_true",
                   help="seesaw plans keep both weight shards on the device (no weight copies)")
    p.add_argument("--seesaw-weight-source", default="auto", choices=SEESAW_WEIGHT_SOURCES)
    p.add_argument("--random-checkpoint", default=None, metavar="DIR",
                   help="run from the shape's random weights written to DIR as safetensors")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the step budget (chunked prefill size); default: the engine's")
    p.add_argument("--max-model-len", type=int, default=4096 + 1024 + 16)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--num-blocks", type=int, default=None, help="default: sized from memory")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: the engine's (on for one-stage static plans and for "
                        "seesaw's decode plan)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("parashift.engine.seesaw_auto").setLevel(logging.INFO)  # auto's table
    model = (random_checkpoint(args.model, args.random_checkpoint, args.dtype)
             if args.random_checkpoint else args.model)
    rows = []
    for name in args.plans:
        # auto chooses from the workload's lengths: one engine per workload
        batches = [[w] for w in args.workloads] if is_auto(name) else [args.workloads]
        for workloads in batches:
            start = time.perf_counter()
            llm = LLM(model=model, dtype=args.dtype, device=args.device,
                      skip_tokenizer_init=True, max_model_len=args.max_model_len,
                      enable_prefix_caching=False,
                      max_num_batched_tokens=args.max_num_batched_tokens,
                      num_blocks=args.num_blocks, cuda_graphs=args.cuda_graphs,
                      **engine_options(name, args, workloads[0]))
            startup_s = time.perf_counter() - start
            for workload in workloads:
                config = llm.llm_engine.config
                row = dict(plan=name, runs=chosen_plan(config),
                           step_tokens=config.max_num_batched_tokens,
                           startup_s=startup_s, **run(llm, workload, args))
                rows.append(row)
                print(json.dumps(row), flush=True)
            llm.llm_engine.shutdown()
            del llm  # free this plan's memory before the next plan sizes its KV pool
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(model=args.model, args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
