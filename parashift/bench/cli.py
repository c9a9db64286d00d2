"""`parashift bench serve ...` and `parashift bench throughput ...`."""
import argparse
import json
import os

from parashift.bench.datasets import (DATASETS, Dataset, bench_tokenizer, random_dataset,
                                      sharegpt_dataset)
from parashift.bench.workloads import WORKLOADS, WorkloadOptions
from parashift.entrypoints.help_format import DefaultsOnceFormatter


def add_bench_args(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("bench", help="benchmark a server or the offline engine",
                                   formatter_class=DefaultsOnceFormatter)
    kinds = parser.add_subparsers(dest="bench_command", required=True)
    _add_serve_parser(kinds)
    _add_throughput_parser(kinds)
    parser.set_defaults(func=run_bench)
    return parser


def _add_workload_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--workload", required=required, choices=list(WORKLOADS),
                       help="a named workload of parashift/bench/workloads.py" +
                       ("" if required else " (default: a --dataset-name dataset instead)"))
    group.add_argument("--seed", type=int, default=0, help="the same seed, the same requests")
    group.add_argument("--num-requests", type=int, default=None,
                       help="override the workload's request count")
    group.add_argument("--length-scale", type=float, default=1.0,
                       help="multiply every input and output length (e.g. 0.05 on a CPU)")


def _add_serve_parser(kinds) -> None:
    p = kinds.add_parser("serve", help="drive a workload against an OpenAI-compatible server",
                         formatter_class=DefaultsOnceFormatter)
    _add_workload_args(p, required=False)
    _add_dataset_args(p)
    p.add_argument("--base-url", default=None,
                   help="the server (default: http://--host:--port)")
    p.add_argument("--host", default=None, help="the server's host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="the server's port (default 8000)")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="vLLM's: openai (or vllm) calls /v1/completions, openai-chat "
                        "/v1/chat/completions (default: as --endpoint says)")
    p.add_argument("--endpoint", default=None,
                   help="the API path, e.g. /v1/chat/completions (vLLM's), or completions | "
                        "chat (default: completions)")
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
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="scale the bursty pattern's steady and burst rates (e.g. 0.3 for a "
                        "model that serves a third as many requests a second)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--slo", default=None, help="goodput limits, e.g. ttft:500,tpot:50 (ms)")
    p.add_argument("--prompt-format", default=None, choices=("ids", "text"),
                   help="token ids (exact lengths) or random words; default ids, text for chat")
    p.add_argument("--vocab-size", type=int, default=32000,
                   help="token-id prompts use ids below this")
    p.add_argument("--temperature", type=float, default=0.0, help="of every request")
    p.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    p.add_argument("--num-warmups", type=int, default=0,
                   help="short requests sent before measuring")
    p.add_argument("--output-dir", default="bench-results", help="where the files go")
    p.add_argument("--timeline-interval", type=float, default=1.0, help="seconds per CSV row")
    p.add_argument("--metrics-interval", type=float, default=0.5,
                   help="seconds between /metrics samples")
    p.add_argument("--plot", action="store_true", help="write PNG plots")


# vLLM's --backend names of the two APIs
BACKENDS = {"openai": "completions", "vllm": "completions", "openai-chat": "chat"}
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def bench_target(args) -> tuple[str, str, str]:
    """(base URL, API kind, path) from --base-url or --host/--port, and --backend and
    --endpoint as vLLM's `bench serve` takes them (or parashift's --endpoint chat)."""
    if args.base_url is not None and (args.host is not None or args.port is not None):
        raise ValueError("give --base-url or --host/--port, not both")
    base_url = args.base_url or f"http://{args.host or '127.0.0.1'}:{args.port or 8000}"
    endpoint = args.endpoint
    if endpoint in API_PATHS:  # parashift's names of the APIs
        kind, path = endpoint, API_PATHS[endpoint]
    elif endpoint is not None:
        if not endpoint.startswith("/"):
            raise ValueError(f"--endpoint must be a path such as /v1/completions, or "
                             f"completions or chat; got {endpoint!r}")
        kind, path = ("chat" if endpoint.rstrip("/").endswith("chat/completions")
                      else "completions"), endpoint
    else:
        kind = BACKENDS.get(args.backend, "completions")
        path = API_PATHS[kind]
    if args.backend is not None and BACKENDS[args.backend] != kind:
        raise ValueError(f"--backend {args.backend} calls the {BACKENDS[args.backend]} API, "
                         f"but --endpoint {endpoint} is the {kind} one")
    return base_url, kind, path


def _add_dataset_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's `bench serve` dataset flags."""
    group = parser.add_argument_group("dataset (vLLM's flags; instead of --workload)")
    group.add_argument("--dataset-name", choices=DATASETS, default=None,
                       help="random token ids or ShareGPT conversations (default: random "
                            "when no --workload is given)")
    group.add_argument("--dataset-path", default=None, help="the ShareGPT JSON file")
    group.add_argument("--num-prompts", type=int, default=1000, help="requests to send")
    group.add_argument("--random-input-len", type=int, default=1024,
                       help="random: prompt tokens")
    group.add_argument("--random-output-len", type=int, default=128,
                       help="random: tokens to generate")
    group.add_argument("--random-range-ratio", type=float, default=0.0,
                       help="random: lengths uniform in [len * (1 - r), len * (1 + r)]")
    group.add_argument("--sharegpt-output-len", type=int, default=None,
                       help="sharegpt: tokens to generate (default: the reply's length)")
    group.add_argument("--tokenizer", default=None,
                       help="sharegpt: the tokenizer that counts lengths, a directory or "
                            ".gguf (default: the embedded SmolLM2's)")


def dataset_from_args(args) -> Dataset | None:
    name = args.dataset_name or (None if args.workload else "random")
    if name is not None and args.workload:
        raise ValueError("give --workload or --dataset-name, not both")
    if name == "random":
        return random_dataset(args.num_prompts, args.random_input_len, args.random_output_len,
                              args.random_range_ratio)
    if name == "sharegpt":
        if not args.dataset_path:
            raise ValueError("--dataset-name sharegpt needs --dataset-path (a ShareGPT JSON file)")
        return sharegpt_dataset(args.dataset_path, args.num_prompts, args.seed,
                                bench_tokenizer(args.tokenizer), args.sharegpt_output_len)
    return None


def _add_throughput_parser(kinds) -> None:
    p = kinds.add_parser("throughput", help="an offline workload in process (no HTTP)",
                         formatter_class=DefaultsOnceFormatter,
                         conflict_handler="resolve")
    _add_workload_args(p)
    p.add_argument("--temperature", type=float, default=0.0, help="of every request")
    p.add_argument("--output-json", default=None, help="write the result here")
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
                           rate_scale=getattr(args, "rate_scale", 1.0),
                           request_rates=parse_rates(getattr(args, "request_rate", None)),
                           burstiness=getattr(args, "burstiness", 1.0))


def run_bench(args: argparse.Namespace) -> None:
    if args.bench_command == "serve":
        _run_serve(args)
    else:
        _run_throughput(args)


def _run_serve(args) -> None:
    from parashift.bench.runner import ServerUnavailableError
    from parashift.bench.serve import ServeBenchConfig, run_serve_benchmark
    from parashift.bench.stats import SLO
    api_key = args.api_key or os.environ.get("PARASHIFT_API_KEY") or \
        os.environ.get("OPENAI_API_KEY")
    dataset = dataset_from_args(args)
    base_url, kind, path = bench_target(args)
    config = ServeBenchConfig(
        workload=None if dataset else args.workload, dataset=dataset,
        base_url=base_url, endpoint=kind, endpoint_path=path,
        model=args.model, api_key=api_key, options=workload_options(args),
        max_concurrency=args.max_concurrency, slo=SLO.parse(args.slo),
        prompt_format=args.prompt_format, vocab_size=args.vocab_size,
        temperature=args.temperature, extra_body=json.loads(args.extra_body or "{}"),
        output_dir=args.output_dir, timeline_interval_s=args.timeline_interval,
        metrics_interval_s=args.metrics_interval, plot=args.plot,
        num_warmups=args.num_warmups)
    try:
        run_serve_benchmark(config)
    except ServerUnavailableError as e:
        raise SystemExit(f"parashift bench serve: {e}") from None


def _run_throughput(args) -> None:
    from parashift.bench.throughput import ThroughputConfig, run_throughput_benchmark
    from parashift.entrypoints.engine_args import engine_config_from_args
    engine_options = engine_config_from_args(args).as_options()
    config = ThroughputConfig(workload=args.workload, engine_options=engine_options,
                              options=workload_options(args), temperature=args.temperature,
                              output_json=args.output_json)
    run_throughput_benchmark(config)


def main(argv: list[str] | None = None) -> None:
    """`python -m parashift.bench serve|throughput ...` without the main CLI."""
    parser = argparse.ArgumentParser(prog="python -m parashift.bench",
                                     formatter_class=DefaultsOnceFormatter)
    kinds = parser.add_subparsers(dest="bench_command", required=True)
    _add_serve_parser(kinds)
    _add_throughput_parser(kinds)
    run_bench(parser.parse_args(argv))
