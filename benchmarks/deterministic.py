"""Deterministic mode (--deterministic): does a request get the same tokens and logprobs
whatever its batch and plan, and what does that cost?

Each model shape (`benchmarks/shapes/`) gets one random checkpoint on disk (seeded per tensor,
written once under --checkpoints), so every plan loads the same weights: `--load-format
dummy` draws each rank's shard on its own and would differ by plan.

Matrix: for each model, `--prompts` random prompts generate `--tokens` greedy tokens (with
logprobs), each prompt alone on one device (the reference), then all together on one
device and under each plan of `--plans`; a sequence counts as identical when its tokens and
every logprob are bit-equal to the reference. Default mode is counted beside deterministic
mode. Plans needing more GPUs than the machine has are skipped (and listed).
Cost: seconds per decode step at each of `--batch-sizes` (prompts of `--context` tokens)
and of one prefill of `--prefill` tokens (one step), deterministic against default, under
each of `--cost-plans`.

GPU (one H200; the multi-rank plans need nvidia-h200-x2):
  PYTHONPATH=. python3 benchmarks/deterministic.py \
      --models benchmarks/shapes/tiny-llama.json benchmarks/shapes/llama-3.1-8b.json \
      --plans single tp2 sp2 pp2 dp2 shift --cost-plans single tp2 shift \
      --out deterministic.jsonl
CPU (a smoke run: tiny model, gloo ranks):
  PYTHONPATH=. python3 benchmarks/deterministic.py --device cpu --prompts 4 --tokens 8 \
      --plans single tp2 sp2 shift --batch-sizes 1 8 --prefill 256 --context 32"""
import argparse
import gc
import json
import random
import time

import torch

from benchmarks.decode_throughput import start_decodes
from benchmarks.random_checkpoint import random_checkpoint
from parashift import LLM, SamplingParams

PLANS = {  # name -> engine options
    "single": {},
    "tp2": dict(tensor_parallel_size=2),
    "sp2": dict(sequence_parallel_size=2),
    "pp2": dict(pipeline_parallel_size=2),
    "dp2": dict(data_parallel_size=2),
    "tp3": dict(tensor_parallel_size=3),
    "sp2tp2": dict(sequence_parallel_size=2, tensor_parallel_size=2),
    # Shift: prefill steps under SP=2, steps of at most 256 tokens (decode) under TP=2
    "shift": dict(sequence_parallel_size=2, parallel_policy="shift"),
}


def ranks_of(plan: str) -> int:
    options = PLANS[plan]
    return (options.get("tensor_parallel_size", 1) * options.get("sequence_parallel_size", 1)
            * options.get("pipeline_parallel_size", 1) * options.get("data_parallel_size", 1))


def free_device_memory() -> None:
    """What an engine that was shut down and dropped held (its KV pool sized to the device)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_llm(args, model: str, deterministic: bool, **options) -> LLM:
    checkpoint = random_checkpoint(model, args.checkpoints, args.dtype)
    return LLM(checkpoint, device=args.device, dtype=args.dtype, skip_tokenizer_init=True, deterministic=deterministic,
               enable_prefix_caching=False, max_model_len=max_len_of(args, model),
               max_num_batched_tokens=max(args.prefill, 2048), long_prefill_token_threshold=0,
               seed=0, **options)


def shape_of(model: str) -> dict:
    with open(model) as f:
        return json.load(f)


def vocab_of(model: str) -> int:
    return shape_of(model)["vocab_size"]


def max_len_of(args, model: str) -> int:
    return min(args.max_model_len, shape_of(model)["max_position_embeddings"])


def prompts_for(args, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(rng.randint(8, 200))]
            for _ in range(args.prompts)]


def sequences(outputs) -> list[tuple]:
    return [(tuple(o.outputs[0].token_ids), tuple(tuple(sorted(lp.items()))
                                                   for lp in o.outputs[0].logprobs))
            for o in outputs]


def matrix(args, model: str, deterministic: bool, available: int) -> list[dict]:
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, logprobs=1)
    prompts = prompts_for(args, vocab_of(model))
    rows, reference = [], None
    for plan in args.plans:
        if ranks_of(plan) > available:
            rows.append(dict(model=model, deterministic=deterministic, plan=plan,
                             skipped=f"needs {ranks_of(plan)} devices, {available} here"))
            continue
        # no more sequences than prompts: start-up captures only the graphs of those buckets
        llm = make_llm(args, model, deterministic, max_num_seqs=len(prompts), **PLANS[plan])
        try:
            if reference is None:  # each prompt alone, on the first plan (single)
                reference = sequences([llm.generate([p], params)[0] for p in prompts])
            got = sequences(llm.generate(prompts, params))
        finally:
            llm.llm_engine.shutdown()
            del llm
            free_device_memory()
        same = sum(a == b for a, b in zip(got, reference))
        rows.append(dict(model=model, deterministic=deterministic, plan=plan,
                         identical=same, of=len(prompts)))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def decode_seconds(args, llm: LLM, batch: int, vocab: int, context: int) -> float:
    engine = llm.llm_engine
    ids = start_decodes(engine, batch, context, vocab)
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.decode_steps):
        engine.step()
    sync(args.device)
    elapsed = (time.perf_counter() - start) / args.decode_steps
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed


def prefill_seconds(args, llm: LLM, vocab: int, length: int) -> float:
    rng = random.Random(1)
    params = SamplingParams(temperature=0, max_tokens=1)
    times = []
    for _ in range(3):  # the first warms up
        prompt = [rng.randrange(vocab) for _ in range(length)]
        sync(args.device)
        start = time.perf_counter()
        llm.generate([prompt], params)
        sync(args.device)
        times.append(time.perf_counter() - start)
    return min(times[1:])


def cost(args, model: str, plan: str) -> list[dict]:
    vocab, rows, max_len = vocab_of(model), [], max_len_of(args, model)
    # a short model's context holds the prompt and the decode steps
    prefill = min(args.prefill, max_len - 1)
    context = min(args.context, max_len - args.decode_steps - 80)
    for deterministic in (False, True):
        llm = make_llm(args, model, deterministic, max_num_seqs=max(args.batch_sizes),
                       **PLANS[plan])
        try:
            row = dict(model=model, plan=plan, deterministic=deterministic, prefill_tokens=prefill,
                       context=context, prefill_s=prefill_seconds(args, llm, vocab, prefill))
            for batch in args.batch_sizes:
                row[f"decode_b{batch}_ms"] = 1e3 * decode_seconds(args, llm, batch, vocab,
                                                                 context)
        finally:
            llm.llm_engine.shutdown()
            del llm  # its KV pool and weights go before the next engine sizes its own
            free_device_memory()
        rows.append(row)
        print(json.dumps(row), flush=True)
    default, det = rows
    slowdown = {k: det[k] / default[k] for k in default if k.endswith(("_s", "_ms"))}
    rows.append(dict(model=model, plan=plan, deterministic_over_default=slowdown))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["benchmarks/shapes/tiny-llama.json"])
    parser.add_argument("--plans", nargs="+", default=["single", "tp2", "sp2", "pp2", "dp2",
                                                       "shift"], choices=list(PLANS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--cost-plans", nargs="+", default=["single"], choices=list(PLANS),
                        help="plans the cost is measured under (those with too few devices "
                             "are left out)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--context", type=int, default=512, help="decode: prompt tokens")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--prefill", type=int, default=4096, help="prefill: prompt tokens")
    parser.add_argument("--skip-matrix", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--modes", nargs="+", default=["deterministic", "default"],
                        choices=["deterministic", "default"], help="the matrix's modes")
    parser.add_argument("--out", help="write every row as a JSON line here")
    parser.add_argument("--checkpoints", default="/tmp/parashift-deterministic",
                        help="where the random checkpoints are written (8B: 16 GB)")
    args = parser.parse_args()
    if args.plans[0] != "single":
        parser.error("the first plan must be single: it runs the reference")
    available = torch.cuda.device_count() if args.device != "cpu" else 4
    rows = []
    for model in args.models:
        if not args.skip_matrix:
            for mode in args.modes:
                rows += matrix(args, model, mode == "deterministic", available)
        for plan in [] if args.skip_cost else args.cost_plans:
            if ranks_of(plan) <= available:
                rows += cost(args, model, plan)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
