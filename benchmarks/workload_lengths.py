"""A bench workload's requests as a `*_workload_file` for a policy's start-up choice
(cost/workload_hint.py): `[prompt_tokens, output_tokens]` pairs, or with `--arrivals`
`[prompt_tokens, output_tokens, arrival_s]` triples; the same requests `parashift bench`
sends for that workload, count and seed.
  python3 benchmarks/workload_lengths.py --workload tail --num-requests 300 \
      --output benchmarks/workloads/tail_300.json"""
import argparse
import json

from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload


def lengths(workload: str, num_requests: int | None, seed: int, arrivals: bool) -> list:
    phases = build_phases(get_workload(workload), WorkloadOptions(seed=seed,
                                                                  num_requests=num_requests))
    requests = [r for phase in phases for r in phase.requests]
    if arrivals:
        return [[r.input_len, r.output_len, round(r.arrival_s, 6)] for r in requests]
    return [[r.input_len, r.output_len] for r in requests]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--num-requests", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arrivals", action="store_true", help="add each request's arrival time")
    p.add_argument("--output", required=True)
    args = p.parse_args()
    rows = lengths(args.workload, args.num_requests, args.seed, args.arrivals)
    with open(args.output, "w") as f:
        json.dump(rows, f)
    print(f"{args.workload}: {len(rows)} requests to {args.output}")


if __name__ == "__main__":
    main()
