"""Flying Serving's transitions on GPUs: replicas under the flying policy merge (into
TP=2 from two, or as wide as the heads allow from four) when two requests run alone and
split when a batch queues; prints each transition's
drain, prepare and cutover times, the requests moved and computed again, and the
decode TPOT of the light phase (merged) as JSON lines.

    python benchmarks/merge_split.py --model benchmarks/shapes/llama-3.1-8b.json
    python benchmarks/merge_split.py --layout single,single,single,single   # four GPUs"""
import argparse
import json
import random
import time
from dataclasses import asdict

from parashift import LLM, SamplingParams


def prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--light-output-len", type=int, default=256)
    p.add_argument("--batch-requests", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layout", default="single,single",
                   help="the node's starting layout: one `single` per replica (DP)")
    args = p.parse_args()
    llm = LLM(model=args.model, dtype="bfloat16", skip_tokenizer_init=True, layout=args.layout,
              parallel_policy="flying", flying_dwell_s=0.0, enable_prefix_caching=False,
              max_model_len=args.input_len + args.light_output_len + 16)
    engine, rng = llm.llm_engine, random.Random(0)
    vocab = engine.vocab_size
    light = SamplingParams(temperature=0, max_tokens=args.light_output_len, ignore_eos=True)
    heavy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.generate(prompts(rng, 2, args.input_len, vocab), heavy)  # warm-up
    engine.take_transition_records()
    for round_ in range(args.rounds):
        start = time.perf_counter()
        outs = llm.generate(prompts(rng, 2, args.input_len, vocab), light)
        light_s = time.perf_counter() - start
        steps = [s for s in engine.take_step_records() if s.num_tokens <= 2]
        tpot = sorted(s.seconds for s in steps)[len(steps) // 2] if steps else None
        layouts = sorted({s.plan for s in steps})
        llm.generate(prompts(rng, args.batch_requests, args.input_len, vocab), heavy)
        for record in engine.take_transition_records():
            print(json.dumps({"round": round_, **asdict(record)}), flush=True)
        print(json.dumps({"round": round_, "light_s": light_s, "decode_step_median_s": tpot,
                          "decode_plans": layouts, "tokens": len(outs[0].outputs[0].token_ids)}),
              flush=True)
    engine.shutdown()


if __name__ == "__main__":
    main()
