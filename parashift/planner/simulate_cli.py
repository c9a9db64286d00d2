"""`parashift plan --simulate`: a bench workload's arrivals through the simulated engine,
summarized as `bench serve` summarizes a run (bench/stats.py)."""
import json
from collections import Counter

from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload
from parashift.config import EngineConfig
from parashift.cost.shape import load_shape
from parashift.planner.recommend import node_model
from parashift.planner.simulate import bench_records, simulate


def engine_config(args, shape_path: str) -> EngineConfig:
    degrees = {k: getattr(args, k) or 1 for k in ("tp", "sp", "dp", "pp")}
    return EngineConfig(model=shape_path, device="cpu", tensor_parallel_size=degrees["tp"],
                        sequence_parallel_size=degrees["sp"], data_parallel_size=degrees["dp"],
                        pipeline_parallel_size=degrees["pp"], layout=args.layout,
                        parallel_policy=args.parallel_policy,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        nnodes=args.nnodes, gpus_per_node=args.gpus_per_node)


def run_simulate(args) -> None:
    if args.model is None or args.workload is None:
        raise SystemExit("parashift plan --simulate needs --model and --workload")
    try:
        from parashift.bench.stats import format_summary, summarize
    except ImportError as e:
        raise SystemExit(f"parashift plan --simulate reports as `bench serve` does, which needs "
                         f"the serve extra ({e.name} is missing): pip install 'parashift[serve]'")
    try:
        shape = load_shape(args.model).quantized(args.quantization, args.kv_cache_dtype)
        workload = get_workload(args.workload)
        config = engine_config(args, _shape_file(args.model))
        gpus = config.node_layout.world_size
        model = node_model(shape, gpus // args.nnodes, args.gpu_kind, args.link_profile)
        phase = build_phases(workload, WorkloadOptions(
            seed=args.seed, num_requests=args.num_requests, time_scale=args.time_scale))[0]
        sim = simulate(config, model, phase.requests)
    except ValueError as e:
        raise SystemExit(f"parashift plan --simulate: {e}") from None
    summary = summarize(bench_records(sim), sim.duration_s, None)
    plans = Counter(step["plan"] for step in sim.steps)
    summary["steps_by_plan"] = dict(plans.most_common())
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(format_summary(f"simulated {args.workload} on {shape.name}, {gpus} GPUs "
                         f"({args.parallel_policy})", summary))
    print("steps by plan: " + ", ".join(f"{k} {v}" for k, v in plans.most_common()))


def _shape_file(model: str) -> str:
    from parashift.cost.shape import SHAPES
    named = SHAPES / f"{model}.json"
    return str(named) if named.is_file() else model
