"""`parashift bench serve ...` and `parashift bench throughput ...`."""
import argparse
import json
import os

from parashift.bench.workloads import WORKLOADS, WorkloadOptions


def add_bench_args(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="benchmark a server or the offline engine")
    kinds = parser.add_subparsers(dest="bench_command", required=True)
    _add_serve_parser(kinds)
    _add_throughput_parser(kinds)
    parser.set_defaults(func=run_bench)
    return parser


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--workload", required=True, choices=list(WORKLOADS),
                       help="a workload of workloads.md")
    group.add_argument("--seed", type=int, default=0, help="the same seed, the same requests")
    group.add_argument("--num-requests", type=int, default=None,
                       help="override the workload's request count")
    group.add_argument("--length-scale", type=float, default=1.0,
                       help="multiply every input and output length (e.g. 0.05 on a CPU)")


def _add_serve_parser(kinds) -> None:
    p = kinds.add_parser("serve", help="drive a workload against an OpenAI-compatible server")
    _add_workload_args(p)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="completions", choices=("completions", "chat"))
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--api-key", default=None,
                   help="default: env PARASHIFT_API_KEY or OPENAI_API_KEY")
    p.add_argument("--request-rate", default=None,
                   help="req/s, or a comma list for a sweep (inf: all at once); overrides "
                        "the workload's arrivals")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of inter-arrival times (1: Poisson, <1: burstier)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="stretch or shrink the bursty pattern's duration")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--slo", default=None, help="goodput limits, e.g. ttft:500,tpot:50 (ms)")
    p.add_argument("--prompt-format", default=None, choices=("ids", "text"),
                   help="token ids (exact lengths) or random words; default ids, text for chat")
    p.add_argument("--vocab-size", type=int, default=32000,
                   help="token-id prompts use ids below this")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    p.add_argument("--num-warmups", type=int, default=0)
    p.add_argument("--output-dir", default="bench-results")
    p.add_argument("--timeline-interval", type=float, default=1.0, help="seconds per CSV row")
    p.add_argument("--metrics-interval", type=float, default=0.5,
                   help="seconds between /metrics samples")
    p.add_argument("--plot", action="store_true", help="write PNG plots")


def _add_throughput_parser(kinds) -> None:
    p = kinds.add_parser("throughput", help="an offline workload in process (no HTTP)",
                         conflict_handler="resolve")
    _add_workload_args(p)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--output-json", default=None)
    from parashift.entrypoints.engine_args import add_engine_args
    add_engine_args(p)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the workload and of the engine")


def parse_rates(text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    return tuple(float(part) for part in text.split(",") if part.strip())


def workload_options(args) -> WorkloadOptions:
    return WorkloadOptions(seed=args.seed, num_requests=args.num_requests,
                           length_scale=args.length_scale,
                           time_scale=getattr(args, "time_scale", 1.0),
                           request_rates=parse_rates(getattr(args, "request_rate", None)),
                           burstiness=getattr(args, "burstiness", 1.0))


def run_bench(args: argparse.Namespace) -> None:
    if args.bench_command == "serve":
        _run_serve(args)
    else:
        _run_throughput(args)


def _run_serve(args) -> None:
    from parashift.bench.serve import ServeBenchConfig, run_serve_benchmark
    from parashift.bench.stats import SLO
    api_key = args.api_key or os.environ.get("PARASHIFT_API_KEY") or \
        os.environ.get("OPENAI_API_KEY")
    config = ServeBenchConfig(
        workload=args.workload, base_url=args.base_url, endpoint=args.endpoint,
        model=args.model, api_key=api_key, options=workload_options(args),
        max_concurrency=args.max_concurrency, slo=SLO.parse(args.slo),
        prompt_format=args.prompt_format, vocab_size=args.vocab_size,
        temperature=args.temperature, extra_body=json.loads(args.extra_body or "{}"),
        output_dir=args.output_dir, timeline_interval_s=args.timeline_interval,
        metrics_interval_s=args.metrics_interval, plot=args.plot,
        num_warmups=args.num_warmups)
    run_serve_benchmark(config)


def _run_throughput(args) -> None:
    from parashift.bench.throughput import ThroughputConfig, run_throughput_benchmark
    from parashift.entrypoints.engine_args import engine_config_from_args
    engine_options = vars(engine_config_from_args(args))
    config = ThroughputConfig(workload=args.workload, engine_options=engine_options,
                              options=workload_options(args), temperature=args.temperature,
                              output_json=args.output_json)
    run_throughput_benchmark(config)


def main(argv: list[str] | None = None) -> None:
    """`python -m parashift.bench serve|throughput ...` without the main CLI."""
    parser = argparse.ArgumentParser(prog="python -m parashift.bench")
    kinds = parser.add_subparsers(dest="bench_command", required=True)
    _add_serve_parser(kinds)
    _add_throughput_parser(kinds)
    run_bench(parser.parse_args(argv))
