"""Step time of the base (SP, TP) plan against the shift plan (TP over SP_TP) as the
step's token count grows; the crossover sets the default shift threshold.

Usage (2 GPUs): python3 benchmarks/shift_crossover.py --model benchmarks/shapes/llama-3.1-8b.json \
    -sp 2 --tokens 1 4 16 64 128 256 512 --output crossover.json
Each --tokens point is a decode step of N sequences at context --context (recorded as
`does_not_fit`, with the pool's block count, where the KV pool cannot hold them); each
--prefill-tokens point is the step that prefills one N-token prompt. Every point is
timed under each plan in turn (a scripted policy pins the plan). The suggested
threshold is the largest point up to which the shift plan wins at every point."""
import argparse
import json
import random
import statistics
import time

from parashift import LLM, SamplingParams
from parashift.engine.policy import ScriptedPolicy


def pin(engine, plan) -> None:
    """Every following step runs under `plan`."""
    engine.set_policy(ScriptedPolicy(engine.policy_plans, lambda group: plan))


def time_steps(llm: LLM, plan, steps: int) -> float:
    engine = llm.llm_engine
    pin(engine, plan)
    for _ in range(2):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fits(llm: LLM, num_seqs: int, context: int, steps: int) -> bool:
    """Whether the KV pool holds num_seqs sequences through the warm-up and timed steps
    of every plan (with fewer, the scheduler preempts and the batch shrinks)."""
    blocks = llm.llm_engine.scheduler.block_manager
    tokens = context + (steps + 2) * len(llm.llm_engine.policy_plans) + 1
    return num_seqs * -(-tokens // blocks.block_size) <= blocks.num_blocks


def measure(llm: LLM, num_seqs: int, context: int, steps: int) -> dict:
    engine, rng = llm.llm_engine, random.Random(num_seqs)
    if not fits(llm, num_seqs, context, steps):
        return {"tokens": num_seqs, "does_not_fit": engine.scheduler.block_manager.num_blocks}
    # Sequences admitted first decode while the rest prefill: room to the end of the
    # context window keeps every one running until the timing is over.
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len - context,
                            ignore_eos=True)
    ids = [f"n{num_seqs}-{i}" for i in range(num_seqs)]
    for rid in ids:
        engine.add_request(rid, [rng.randrange(engine.vocab_size) for _ in range(context)], params)
    pin(engine, engine.policy_plans[0])
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) \
            or engine.scheduler.num_waiting:
        engine.step()
    row = {"tokens": num_seqs}
    for plan in engine.policy_plans:
        row[plan.name()] = 1e3 * time_steps(llm, plan, steps)
    if len(engine.scheduler.running) != num_seqs:
        raise RuntimeError(f"{len(engine.scheduler.running)} of {num_seqs} sequences ran to the end")
    for rid in ids:
        engine.abort_request(rid)
    return row


def measure_prefill(llm: LLM, num_tokens: int, repeats: int = 3) -> dict:
    engine, rng = llm.llm_engine, random.Random(num_tokens)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    row = {"tokens": num_tokens, "prefill": True}
    for plan in engine.policy_plans:
        pin(engine, plan)
        times = []
        for i in range(repeats + 1):  # the first warms up
            engine.add_request(f"p{num_tokens}-{plan.name()}-{i}",
                               [rng.randrange(engine.vocab_size) for _ in range(num_tokens)], params)
            start = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            times.append(time.perf_counter() - start)
        row[plan.name()] = 1e3 * statistics.median(times[1:])
    return row


def suggested_threshold(rows: list[dict], base: str, shift: str) -> int:
    threshold = 0
    for row in sorted(rows, key=lambda r: r["tokens"]):
        if "does_not_fit" in row:
            continue
        if row[shift] >= row[base]:
            break
        threshold = row["tokens"]
    return threshold


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("-sp", "--sequence-parallel-size", type=int, default=2)
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--shift-weights", default="separate")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 128, 256, 512])
    p.add_argument("--prefill-tokens", type=int, nargs="*", default=[],
                   help="also time single-prompt prefill steps of these sizes, e.g. 1024 2048 4096")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: room for 1024 tokens past --context (no sequence finishes early)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="auto")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on where possible (CUDA, triton attention)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    llm = LLM(model=args.model, dtype=args.dtype, device=args.device, skip_tokenizer_init=True,
              max_model_len=args.max_model_len or max([args.context + 1024, *args.prefill_tokens]) + 16,
              max_num_batched_tokens=max([8192, *args.prefill_tokens]),
              long_prefill_token_threshold=0,  # each timed prefill in one step
              max_num_seqs=max(args.tokens),
              enable_prefix_caching=False, parallel_policy="shift",
              sequence_parallel_size=args.sequence_parallel_size,
              tensor_parallel_size=args.tensor_parallel_size, shift_weights=args.shift_weights,
              cuda_graphs=args.cuda_graphs)
    base, shift = (plan.name() for plan in llm.llm_engine.policy_plans)
    rows = []
    for n in args.tokens:
        rows.append(measure(llm, n, args.context, args.steps))
        print(json.dumps(rows[-1]), flush=True)
    for n in args.prefill_tokens:
        rows.append(measure_prefill(llm, n))
        print(json.dumps(rows[-1]), flush=True)
    threshold = suggested_threshold(rows, base, shift)
    print(f"shift plan ({shift}) is faster up to {threshold} tokens per step "
          f"(of those measured): suggested --shift-threshold {threshold}")
    llm.llm_engine.shutdown()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "suggested_threshold": threshold}, f,
                      indent=1)


if __name__ == "__main__":
    main()
