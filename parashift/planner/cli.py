"""The planner's options of `parashift plan`, registered on its parser by parashift/cli.py."""


def add_planner_args(p) -> None:
    """`parashift plan --recommend | --simulate` on `plan`'s parser (the rest of `plan`'s
    options print plans): the planner's options, and its run where they ask for it."""
    print_plans = p.get_default("func")
    p.set_defaults(func=lambda args: run_planner(args) if planner_asked(args) else print_plans(args))
    p.add_argument("--recommend", action="store_true",
                   help="rank the plans and policies of --gpus for --workload by the cost model")
    p.add_argument("--simulate", action="store_true",
                   help="run --workload through the engine (scheduler, policy) on the cost model "
                        "instead of GPUs, under the plan the degrees give (-tp, -sp, -dp, -pp) "
                        "and --parallel-policy; report what `bench serve` reports")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="--simulate: the workload's arrival pattern over this fraction of its time")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="--simulate: the step token budget (the server's on GPUs)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs in all (with --recommend)")
    p.add_argument("--gpu-kind", default="h200", help="the GPU kind whose profiles to use")
    p.add_argument("--link-profile", default="nvlink",
                   help="--recommend/--simulate: the GPUs' link: nvlink (the committed NVLink "
                        "profile), pcie (the committed PCIe-like one: NCCL through host "
                        "memory) or a link profile's JSON file")
    p.add_argument("--forecast", default="trace", choices=["trace", "rate"],
                   help="--recommend, online workloads: from the workload's arrival trace "
                        "(default) or from its mean rate")
    p.add_argument("--workload", default=None, help="a bench workload: chat, batch, bursty, "
                                                    "summarize, priority, tail, ...")
    p.add_argument("--num-requests", type=int, default=None,
                   help="requests drawn from the workload (default: the workload's)")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed")
    p.add_argument("--quantization", default=None, choices=["fp8"],
                   help="--recommend/--simulate: FP8 linear weights (as the engine's flag)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"],
                   help="--recommend/--simulate: the KV cache's dtype (as the engine's flag)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def planner_asked(args) -> bool:
    return bool(getattr(args, "recommend", False) or getattr(args, "simulate", False))


def run_planner(args) -> None:
    if args.simulate:
        from parashift.planner.simulate_cli import run_simulate
        return run_simulate(args)
    import json

    from parashift.bench.workloads import WorkloadOptions
    from parashift.planner.recommend import recommend, render
    missing = [flag for flag, value in (("--model", args.model), ("--gpus", args.gpus),
                                        ("--workload", args.workload)) if value is None]
    if missing:
        raise SystemExit(f"parashift plan --recommend needs {', '.join(missing)}")
    try:
        rec = recommend(args.model, args.gpus, args.workload, args.nnodes, args.gpu_kind,
                        WorkloadOptions(seed=args.seed, num_requests=args.num_requests),
                        args.quantization, args.kv_cache_dtype, args.link_profile,
                        args.forecast == "trace")
    except ValueError as e:
        raise SystemExit(f"parashift plan --recommend: {e}") from None
    print(json.dumps(rec.as_dict(), indent=1) if args.json else render(rec))
