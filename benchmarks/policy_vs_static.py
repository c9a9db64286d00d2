"""PREDICTIONS, not measurements: each design's policy against the best static plan, in the
simulator (planner/simulate.py: the real scheduler and policies on the cost model's clock).

For the 8B shape (bf16) and the 70B shape (FP8 weights) on 2, 4 and 8 H200s (the committed
profiles; eight GPUs use the four-GPU link profile scaled by ring traffic), every bench
workload runs under every static plan of pp = 1 that fits (DP included) and under each
design's policy with `--cost-profile` (the committed H200 profile):

- Shift: SP over all GPUs, shifting to TP at the cost model's crossover; told the workload
  as Seesaw is, its start-up runs the best static plan where the model predicts Shift loses;
- Flying: DP over all GPUs, merging and splitting by its cost check; told the workload as
  Seesaw is, it merges no wider than the width of the layout the model predicts best;
- Seesaw `--prefill-plan auto`: the pair or static plan the cost model picks at start-up;
- SiDP: DP over all GPUs sharing FFN weights, CaS/WaS by the model's B_th; told the
  workload as Seesaw is, its start-up runs the best static plan where the model predicts
  SiDP loses (bf16 dense only: not 70B FP8).

The deciding metric per workload: combined throughput (input + output tokens / s) for the
offline workloads (batch, chat, summarize, tail); for the online ones (bursty, priority) a
request's median end-to-end latency (TTFT + its output x TPOT: what `plan --recommend`
ranks online plans by); median TTFT and TPOT are reported beside. A policy's ratio is
its figure over the best static plan's (for times, the best static's over the policy's), so
>= 0.98 passes the issue's bar.

Scale (to keep the run to minutes on two CPU cores): lengths x LENGTH_SCALE, offline
workloads OFFLINE_REQUESTS requests, bursty at time scale BURSTY_TIME_SCALE (the same rates,
shorter bursts), priority PRIORITY_REQUESTS requests at its rates.

Usage: python3 benchmarks/policy_vs_static.py [--gpus 2 4 8] [--shapes ...] [--workloads ...]
writes benchmarks/results/policy_vs_static.json (a table in docs/results.md by
benchmarks/results_table.py)."""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload
from parashift.config import EngineConfig
from parashift.cost.shape import SHAPES, load_shape
from parashift.planner.recommend import node_model, static_plans
from parashift.planner.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "policy_vs_static.json"
PROFILE = ROOT / "benchmarks" / "results" / "profiles" / "h200_compute.json"
SHAPE_SET = {"llama-3.1-8b": None, "llama-3.1-70b": "fp8"}
WORKLOADS = ("chat", "batch", "bursty", "summarize", "priority", "tail")
OFFLINE = ("chat", "batch", "summarize", "tail")
LENGTH_SCALE = 0.25
OFFLINE_REQUESTS = 64
PRIORITY_REQUESTS = 96
BURSTY_TIME_SCALE = 0.05
MAX_BATCHED_TOKENS = 8192
BAR = 0.98


def workload_options(name: str) -> WorkloadOptions:
    if name == "bursty":
        return WorkloadOptions(length_scale=LENGTH_SCALE, time_scale=BURSTY_TIME_SCALE)
    count = PRIORITY_REQUESTS if name == "priority" else OFFLINE_REQUESTS
    return WorkloadOptions(length_scale=LENGTH_SCALE, num_requests=count)


def contenders(shape_name: str, gpus: int, workload: str, requests) -> dict[str, dict]:
    """name -> EngineConfig keywords: the static plans (pp = 1) that fit, then the policies
    (Shift, Seesaw's `auto` and SiDP told the requests' lengths and, online, their mean
    arrival rate, as their options let a user tell them)."""
    shape = load_shape(shape_name).quantized(SHAPE_SET[shape_name])
    out = {}
    for plan in static_plans(gpus, gpus):
        if plan.pp > 1:
            continue
        try:
            plan.check_model(shape.num_heads, shape.num_kv_heads, shape.num_layers,
                             shape.intermediate or None)
        except ValueError:
            continue
        out[plan.name()] = dict(data_parallel_size=plan.dp, sequence_parallel_size=plan.sp,
                                tensor_parallel_size=plan.tp, parallel_policy="static")
    hint = dict(workload_file=lengths_file(workload, requests, workload not in OFFLINE),
                request_rate=None if workload in OFFLINE else arrival_rate(requests))
    out["shift"] = dict(sequence_parallel_size=gpus, parallel_policy="shift",
                        **{f"shift_{k}": v for k, v in hint.items()})
    out["flying"] = dict(data_parallel_size=gpus, parallel_policy="flying",
                         **{f"flying_{k}": v for k, v in hint.items()})
    out["seesaw-auto"] = dict(parallel_policy="seesaw", prefill_plan=f"auto:{gpus}",
                              cpu_kv_gib=64.0, **{f"seesaw_{k}": v for k, v in hint.items()})
    if SHAPE_SET[shape_name] is None:
        out["sidp"] = dict(data_parallel_size=gpus, parallel_policy="sidp",
                           **{f"sidp_{k}": v for k, v in hint.items()})
    return out


def lengths_file(workload: str, requests, online: bool) -> str:
    """The requests' [prompt, output] lengths, online with their arrival times, as a JSON
    file (what the policies' start-up choices are told: `seesaw_workload_file`,
    `sidp_workload_file`, `shift_workload_file`)."""
    path = Path(tempfile.gettempdir()) / f"policy_vs_static_{workload}_lengths.json"
    path.write_text(json.dumps([[r.input_len, r.output_len] + ([r.arrival_s] if online else [])
                                for r in requests]))
    return str(path)


def arrival_rate(requests) -> float:
    """The requests' mean arrival rate (requests a second)."""
    times = sorted(r.arrival_s for r in requests)
    return (len(times) - 1) / (times[-1] - times[0])


def metrics(sim) -> dict:
    """Combined throughput (tok/s), median TTFT and TPOT (ms) of a simulated run."""
    done = [r for r in sim.requests if r["end_s"] is not None]
    tokens = sum(r["input_len"] + r["tokens"] for r in done)
    tpots = [(r["end_s"] - r["first_token_s"]) / (r["tokens"] - 1) for r in done if r["tokens"] > 1]
    return {"throughput": tokens / sim.duration_s,
            "ttft_ms": 1e3 * statistics.median(r["first_token_s"] - r["arrival_s"] for r in done),
            "e2el_ms": 1e3 * statistics.median(r["end_s"] - r["arrival_s"] for r in done),
            "tpot_ms": 1e3 * statistics.median(tpots) if tpots else 0.0,
            "finished": len(done), "requests": len(sim.requests), "steps": len(sim.steps),
            "plans": sorted({s["plan"] for s in sim.steps})}


def run_one(shape_name: str, gpus: int, keywords: dict, requests) -> dict:
    shape = load_shape(shape_name).quantized(SHAPE_SET[shape_name])
    model = node_model(shape, gpus, "h200")
    config = EngineConfig(model=str(SHAPES / f"{shape_name}.json"), device="cpu",
                          cost_profile=str(PROFILE), quantization=SHAPE_SET[shape_name],
                          max_num_batched_tokens=MAX_BATCHED_TOKENS, **keywords)
    return metrics(simulate(config, model, requests))


def ratio(policy: dict, best: dict, metric: str) -> float:
    if metric == "throughput":
        return policy[metric] / best[metric]
    return best[metric] / policy[metric] if policy[metric] > 0 else 1.0


def compare(shape_name: str, gpus: int, workload: str) -> list[dict]:
    requests = build_phases(get_workload(workload), workload_options(workload))[0].requests
    runs, errors = {}, {}
    for name, keywords in contenders(shape_name, gpus, workload, requests).items():
        started = time.time()
        try:
            runs[name] = run_one(shape_name, gpus, keywords, requests)
        except (ValueError, RuntimeError) as e:
            errors[name] = str(e).splitlines()[0][:200]
            print(f"  {name}: not run ({errors[name]})", flush=True)
            continue
        print(f"  {name}: {runs[name]['throughput']:.0f} tok/s, E2E "
              f"{runs[name]['e2el_ms']:.1f} ms, TTFT "
              f"{runs[name]['ttft_ms']:.1f} ms, TPOT {runs[name]['tpot_ms']:.2f} ms "
              f"({time.time() - started:.1f} s)", flush=True)
    metric = "throughput" if workload in OFFLINE else "e2el_ms"
    statics = {k: v for k, v in runs.items() if k not in POLICIES}
    if not statics:
        return []
    higher = metric == "throughput"
    best = (max if higher else min)(statics, key=lambda k: statics[k][metric])
    rows = []
    for policy in POLICIES:
        row = {"id": f"{shape_name}-{gpus}gpu-{workload}-{policy}", "shape": shape_name,
               "quantization": SHAPE_SET[shape_name], "gpus": gpus, "workload": workload,
               "policy": policy, "metric": metric, "best_static": best}
        if policy not in runs:
            rows.append(row | {"not_run": errors.get(policy, "not applicable to this shape")})
            continue
        row["ratios"] = {m: round(ratio(runs[policy], statics[best], m), 4)
                         for m in ("throughput", "e2el_ms", "ttft_ms", "tpot_ms")}
        row["ratio"] = row["ratios"][metric]
        row["passes"] = row["ratio"] >= BAR
        row["policy_figures"] = _rounded(runs[policy])
        row["best_static_figures"] = _rounded(statics[best])
        rows.append(row)
    return rows


POLICIES = ("shift", "flying", "seesaw-auto", "sidp")
# Why a row stays below the bar (the cause found, with its numbers), by row id: none since
# the start-up choices and Flying's widest merge forecast online workloads from their arrival
# trace (cost/forecast_trace.py; the mean rate had put TP8 ahead on eight GPUs under `bursty`)
BELOW_BAR: dict[str, str] = {}


def _rounded(figures: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPE_SET))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--output", default=str(OUT))
    args = parser.parse_args(argv)
    rows = []
    for shape_name in args.shapes:
        for gpus in args.gpus:
            for workload in args.workloads:
                print(f"{shape_name} on {gpus} H200s, {workload}:", flush=True)
                rows += compare(shape_name, gpus, workload)
                Path(args.output).write_text(json.dumps(document(rows), indent=1) + "\n")
    failing = [r["id"] for r in rows if r.get("passes") is False]
    print(f"{len(rows)} rows; below {BAR}: {', '.join(failing) or 'none'}")
    return 0


def document(rows: list[dict]) -> dict:
    ran = [r for r in rows if "ratio" in r]
    return {"title": "Predictions (not measured): each policy against the best static plan, "
                     "simulated on H200s",
            "source": "benchmarks/policy_vs_static.py: the simulator over "
                      "benchmarks/results/profiles/*.json",
            "scale": {"length_scale": LENGTH_SCALE, "offline_requests": OFFLINE_REQUESTS,
                      "priority_requests": PRIORITY_REQUESTS,
                      "bursty_time_scale": BURSTY_TIME_SCALE,
                      "max_num_batched_tokens": MAX_BATCHED_TOKENS},
            "summary": {"rows": len(rows), "ran": len(ran),
                        "at_or_above_bar": sum(r["passes"] for r in ran), "bar": BAR,
                        "by_policy": {p: f"{sum(r['passes'] for r in ran if r['policy'] == p)}/"
                                         f"{sum(r['policy'] == p for r in ran)}"
                                      for p in POLICIES},
                        "deciding_metric": "throughput for chat, batch, summarize, tail; "
                                           "median end-to-end latency for bursty, priority",
                        "notes": {r["id"]: BELOW_BAR[r["id"]] for r in ran
                                  if not r["passes"] and r["id"] in BELOW_BAR}},
            "comparison": rows}


if __name__ == "__main__":
    sys.exit(main())
