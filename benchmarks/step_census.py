"""An offline run's steps by kind, through the simulator (the real scheduler on the cost
model's clock, planner/simulate.py): graph decodes, steps that prefill inside a mixed graph,
steps that prefill eagerly beside more decodes than a mixed graph holds, and steps of more
token rows than the largest mixed graph; each kind's count and modelled seconds. Given the
measured seconds of the run (`--measured`), the time a step of the eager kind would take if
the whole miss were there.

Usage: PYTHONPATH=. python3 benchmarks/step_census.py --plans tp2 dp2 shift-sp2
       [--workload-file benchmarks/workloads/chat_600.json] [--budget 16384]
       [--measured tp2=31.77 dp2=18.12] [--wide-seqs 256]"""
import argparse
import json
from collections import defaultdict
from pathlib import Path

from parashift.bench.workloads import BenchRequest
from parashift.config import EngineConfig
from parashift.cost.profile import load
from parashift.cost.shape import SHAPES, load_shape
from parashift.cost.step import (MIXED_GRAPH_ROWS, MIXED_GRAPH_SEQS, MIXED_GRAPH_WIDE_SEQS,
                                 StepModel)
from parashift.planner.simulate import simulate

PROFILES = SHAPES.parent / "results" / "profiles"
DEGREES = {"tp": "tensor_parallel_size", "dp": "data_parallel_size", "sp": "sequence_parallel_size"}


def config_of(name: str, shape: str, budget: int) -> EngineConfig:
    """`tp2`, `dp2`, `sp2` (static) or `shift-sp2` (the shift policy over SP)."""
    policy, plan = ("shift", name.removeprefix("shift-")) if name.startswith("shift-") else (
        "static", name)
    return EngineConfig(model=str(SHAPES / f"{shape}.json"), device="cpu", max_model_len=8192,
                        max_num_batched_tokens=budget, parallel_policy=policy,
                        **{DEGREES[plan[:2]]: int(plan[2:])})


def kind(step: dict, wide_seqs: int = 0) -> str:
    """`wide_seqs`: the most sequences a wide mixed bucket holds (0: none)."""
    chunks = step["chunks"]
    rows = sum(length for _, length, _ in chunks)
    if all(length == 1 for _, length, _ in chunks):
        return "graph decode"
    if rows > MIXED_GRAPH_ROWS:
        return f"prefill of > {MIXED_GRAPH_ROWS} rows"
    most = max(MIXED_GRAPH_SEQS, wide_seqs)
    if len(chunks) > most:
        return f"eager: prefill beside > {most} sequences"
    return "mixed graph"


def census(name: str, shape: str, budget: int, requests: list[BenchRequest],
           wide_seqs: int = MIXED_GRAPH_WIDE_SEQS) -> dict:
    gpus = int(name.removeprefix("shift-")[2:])
    model = StepModel(load_shape(shape), load(PROFILES / "h200_compute.json"),
                      load(PROFILES / f"h200x{gpus}_link.json"), prefill_graphs=True,
                      wide_graph_seqs=wide_seqs)
    sim = simulate(config_of(name, shape, budget), model, requests)
    kinds = defaultdict(lambda: [0, 0.0])
    for step in sim.steps:
        key = (step["plan"], kind(step, wide_seqs))
        kinds[key][0] += 1
        kinds[key][1] += step["end_s"] - step["start_s"]
    return {"duration_s": sim.duration_s, "kinds": dict(kinds)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="+", default=["tp2", "dp2"])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--workload-file", default=str(SHAPES.parent / "workloads" / "chat_600.json"))
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--measured", nargs="*", default=[], metavar="PLAN=SECONDS")
    parser.add_argument("--wide-seqs", type=int, default=MIXED_GRAPH_WIDE_SEQS,
                        help="the wide mixed buckets' sequences (PARASHIFT_MIXED_GRAPH_WIDE_SEQS"
                             "; 0: none)")
    args = parser.parse_args(argv)
    measured = {k: float(v) for k, v in (m.split("=") for m in args.measured)}
    lengths = json.loads(Path(args.workload_file).read_text())
    requests = [BenchRequest(i, p, o, 0.0) for i, (p, o) in enumerate(lengths)]
    for name in args.plans:
        result = census(name, args.shape, args.budget, requests, args.wide_seqs)
        print(f"{name}: {result['duration_s']:.2f} s simulated")
        eager = 0  # the most a replica runs (DP's replicas step side by side)
        for (plan, what), (count, seconds) in sorted(result["kinds"].items()):
            print(f"  {plan:>10}  {what:<40} {count:6d} steps  {seconds:7.2f} s  "
                  f"{1e3 * seconds / count:7.1f} ms a step")
            eager = max(eager, count if what.startswith("eager") else 0)
        if name in measured and eager:
            extra = (measured[name] - result["duration_s"]) / eager * 1e3
            print(f"  measured {measured[name]:.2f} s: {extra:+.1f} ms on each eager step")


if __name__ == "__main__":
    main()
