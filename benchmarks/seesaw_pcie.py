"""Where Seesaw would beat the best static plan: the cost model's offline throughput of every
static plan and Seesaw pair of `plan --recommend` (planner/recommend.py candidates), on
`summarize` (500 requests), by model, GPUs and link: NVLink, the PCIe-like profile
(benchmarks/cost_profiles_pcie.py: NCCL through host memory at its fitted rate) and the
same at a half and at twice that rate. Eight GPUs take the four-GPU profiles, scaled by
ring traffic. "PP, one replica": PP over every GPU as one replica, a step's micro-batches
in turn (as the paper's PP baseline runs; this engine's PP group serves a replica per
stage). Writes benchmarks/results/seesaw_pcie.json; prints a markdown table
(docs/planning.md).

Usage: python3 benchmarks/seesaw_pcie.py [--check]"""
import argparse
import json
import sys
from pathlib import Path

from cost_profiles_pcie import LATENCY_S, pcie_link
from parashift.bench.workloads import WorkloadOptions, get_workload
from parashift.cost.forecast import predict_all
from parashift.cost.links import choose_link
from parashift.cost.profile import load
from parashift.cost.runs import Engine, Served, offline_s
from parashift.cost.shape import load_shape
from parashift.cost.step import StepModel
from parashift.parallel.plan import Plan
from parashift.planner.recommend import PROFILES, candidates, workload_requests

OUT = Path(__file__).resolve().parent / "results" / "seesaw_pcie.json"
CASES = [(shape, gpus) for shape in ("llama-3.1-8b", "llama-3.1-70b") for gpus in (2, 4, 8)]
LINKS = ("nvlink", "pcie x0.5", "pcie", "pcie x2")


def link_of(name: str, gpus: int):
    if name == "nvlink":
        return choose_link(PROFILES, "h200", gpus)
    fitted = choose_link(PROFILES, "h200", gpus, "pcie")
    nvlink = choose_link(PROFILES, "h200", gpus)
    scale = float(name.split("x")[1]) if " x" in name else 1.0
    (b0, s0), (b1, s1) = fitted.collectives["send_recv"]["graph"].points[-2:]
    return pcie_link(nvlink, LATENCY_S, (b1 - b0) / (s1 - s0) * scale)


def case(shape: str, gpus: int, link: str, reqs: list) -> dict:
    model = StepModel(load_shape(shape), load(PROFILES / "h200_compute.json"), link_of(link, gpus))
    chosen, _ = candidates(model.shape, gpus, gpus, offline=True)
    predicted, _ = predict_all(model, chosen, reqs, float("inf"), Engine())
    one_replica = Served(Plan(pp=gpus), stage_replicas=False)  # PP as the paper's baselines run it
    pp_one = sum(i + o for i, o in reqs) / offline_s(model, one_replica, reqs, Engine())
    static = max((p for p in predicted if p.kind == "static"), key=lambda p: p.throughput)
    seesaw = max((p for p in predicted if p.kind == "seesaw"), key=lambda p: p.throughput,
                 default=None)
    return {"shape": shape, "gpus": gpus, "link": link,
            "best_static": static.name, "static_tok_s": round(static.throughput),
            "seesaw": seesaw and seesaw.name, "seesaw_tok_s": seesaw and round(seesaw.throughput),
            "seesaw_over_static": seesaw and round(seesaw.throughput / static.throughput, 3),
            "pp_one_replica_tok_s": round(pp_one),
            "tp_tok_s": round(next(p.throughput for p in predicted if p.name == f"tp{gpus}"))
            if any(p.name == f"tp{gpus}" for p in predicted) else None}


def table(rows: list[dict]) -> str:
    lines = ["| model | GPUs | link | best static (tok/s) | TP (tok/s) | PP, one replica "
             "(tok/s) | best Seesaw pair (tok/s) | Seesaw ÷ best static |",
             "|---|---:|---|---|---:|---:|---|---:|"]
    for r in rows:
        seesaw = f"{r['seesaw']} ({r['seesaw_tok_s']:,})" if r["seesaw"] else "–"
        tp = f"{r['tp_tok_s']:,}" if r["tp_tok_s"] else "does not fit"
        lines.append(f"| {r['shape']} | {r['gpus']} | {r['link']} | {r['best_static']} "
                     f"({r['static_tok_s']:,}) | {tp} | {r['pp_one_replica_tok_s']:,} | {seesaw} | "
                     f"{r['seesaw_over_static'] or '–'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    reqs, _ = workload_requests(get_workload("summarize"), WorkloadOptions())
    rows = [case(shape, gpus, link, reqs) for shape, gpus in CASES for link in LINKS]
    text = json.dumps({"source": "benchmarks/seesaw_pcie.py", "workload": "summarize, 500 "
                       "requests, offline", "rows": rows}, indent=1) + "\n"
    if args.check:
        return int(not OUT.exists() or OUT.read_text() != text)
    OUT.write_text(text)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
