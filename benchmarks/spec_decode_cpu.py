"""Output tokens/s with speculative decoding (ngram, suffix) against none, on the CPU with
the embedded SmolLM2, on the `repeat` workload (outputs copy their inputs) and on `chat`.

Usage: python3 benchmarks/spec_decode_cpu.py --repeats 3 --output out.json
(--with-async adds each method under async scheduling, which is off with speculation
unless asked for: a drafting sequence waits for its tokens, the others decode ahead.)
One engine per method, made once; the runs interleave (each repeat runs every method on
every workload in turn), so that a machine shared with other work slows them alike; the
figure of each is the median. Greedy: every method gives the same tokens (checked)."""
import argparse
import json
import statistics
import time
from pathlib import Path

from parashift import LLM, SamplingParams
from parashift.bench.prompts import fill_repeat_prompts, fill_token_prompts
from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload

METHODS = {"none": None,
           "ngram": {"method": "ngram", "num_speculative_tokens": 4},
           "suffix": {"method": "suffix", "num_speculative_tokens": 8}}


def requests_of(llm: LLM, workload: str, options: WorkloadOptions):
    spec = get_workload(workload)
    requests = build_phases(spec, options)[0].requests
    if spec.prompts == "repeat":
        fill_repeat_prompts(requests, options.seed)
        for r in requests:
            r.prompt = llm.llm_engine.apply_chat_template([{"role": "user", "content": r.prompt}])
    else:
        fill_token_prompts(requests, options.seed, llm.llm_engine.vocab_size)
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=r.ignore_eos)
              for r in requests]
    return [r.prompt for r in requests], params


def counts(llm: LLM) -> tuple[int, int, int]:
    stats = llm.llm_engine.spec_decode_stats()
    return (0, 0, 0) if stats is None else \
        (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)


def run_once(llm: LLM, prompts, params) -> tuple[float, list[list[int]], tuple]:
    """Output tokens/s, the tokens, and the (drafts, draft tokens, accepted) it added."""
    before = counts(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return (sum(map(len, tokens)) / elapsed, tokens,
            tuple(b - a for a, b in zip(before, counts(llm))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workloads", nargs="+", default=["repeat", "chat"])
    p.add_argument("--num-requests", type=int, default=4)
    p.add_argument("--length-scale", nargs="+", type=float, default=[0.1, 0.05],
                   help="per workload, in --workloads' order")
    p.add_argument("--output", default=None)
    p.add_argument("--with-async", action="store_true",
                   help="also each method with async_scheduling=True (named METHOD+async)")
    args = p.parse_args()
    engines = {name: LLM(device="cpu", dtype="float32", speculative_config=spec)
               for name, spec in METHODS.items()}
    if args.with_async:
        engines.update({f"{name}+async": LLM(device="cpu", dtype="float32",
                                             speculative_config=spec, async_scheduling=True)
                        for name, spec in METHODS.items() if spec is not None})
    work = {w: requests_of(engines["none"], w, WorkloadOptions(
        num_requests=args.num_requests, length_scale=scale))
        for w, scale in zip(args.workloads, args.length_scale)}
    rates = {(w, m): [] for w in work for m in engines}
    spec_counts = {(w, m): [0, 0, 0] for w in work for m in engines}
    reference = {}
    for repeat in range(args.repeats):
        for w, (prompts, params) in work.items():
            for m, llm in engines.items():
                rate, tokens, added = run_once(llm, prompts, params)
                spec_counts[(w, m)] = [a + b for a, b in zip(spec_counts[(w, m)], added)]
                if reference.setdefault(w, tokens) != tokens:
                    raise RuntimeError(f"{m} on {w}: other tokens than without speculation")
                rates[(w, m)].append(rate)
                print(json.dumps({"repeat": repeat, "workload": w, "method": m,
                                  "output_tokens_per_s": round(rate, 2)}), flush=True)
    rows = []
    for (w, m), values in rates.items():
        drafts, drafted, accepted = spec_counts[(w, m)]
        rows.append(dict(workload=w, method=m, runs=[round(v, 2) for v in values],
                         median_output_tokens_per_s=round(statistics.median(values), 2),
                         output_tokens=sum(map(len, reference[w])),
                         acceptance_rate=round(accepted / drafted, 3) if drafted else None,
                         mean_accepted_length=round(1 + accepted / drafts, 3)
                         if drafts else None))
    for row in rows:
        base = next(r for r in rows if r["workload"] == row["workload"] and r["method"] == "none")
        row["speedup"] = round(row["median_output_tokens_per_s"]
                               / base["median_output_tokens_per_s"], 3)
        print(json.dumps(row), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(dict(num_requests=args.num_requests,
                                                     length_scale=args.length_scale,
                                                     methods=METHODS, rows=rows), indent=1))


if __name__ == "__main__":
    main()
