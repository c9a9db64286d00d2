"""`parashift bench serve`: a workload against a running OpenAI-compatible server."""
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from parashift.bench.client import Endpoint
from parashift.bench.datasets import Dataset
from parashift.bench.prompts import fill_repeat_prompts, fill_text_prompts, fill_token_prompts
from parashift.bench.report import (build_timeline, peak_output_throughput,
                                    write_requests_json, write_summary_json,
                                    write_timeline_csv)
from parashift.bench.runner import PhaseResult, discover_model, run_phase, warm_up
from parashift.bench.server_metrics import spec_decode_summary
from parashift.bench.stats import SLO, format_summary, summarize
from parashift.bench.workloads import WORKLOADS, WorkloadOptions, build_phases, get_workload


@dataclass
class ServeBenchConfig:
    workload: str | None = None  # a workload's name, or None with a dataset
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "completions"  # completions | chat
    endpoint_path: str | None = None  # the API's path; None: the endpoint's /v1 one
    model: str | None = None  # None: the first of /v1/models
    api_key: str | None = None
    options: WorkloadOptions = field(default_factory=WorkloadOptions)
    max_concurrency: int | None = None
    slo: SLO | None = None
    prompt_format: str | None = None  # ids | text; None: ids for completions, text for chat
    vocab_size: int = 32000  # token-id prompts draw ids below this
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)
    output_dir: str = "bench-results"
    timeline_interval_s: float = 1.0
    metrics_interval_s: float = 0.5
    plot: bool = False
    num_warmups: int = 0
    dataset: Dataset | None = None  # vLLM's random or sharegpt, instead of a workload

    def __post_init__(self):
        if (self.workload is None) == (self.dataset is None):
            raise ValueError("give a workload or a dataset (not both)")
        if self.dataset is not None:
            self.workload = self.dataset.workload.name
        else:
            get_workload(self.workload)
        if self.dataset is not None and self.dataset.prompts is not None:
            self.prompt_format = self.prompt_format or "text"
            if self.prompt_format != "text":
                raise ValueError(f"the {self.workload} dataset has text prompts, not ids")
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be completions or chat, got {self.endpoint!r}")
        if self.prompt_format is None:
            self.prompt_format = "text" if self.endpoint == "chat" else "ids"
        if self.prompt_format not in ("ids", "text"):
            raise ValueError(f"prompt_format must be ids or text, got {self.prompt_format!r}")
        if self.endpoint == "chat" and self.prompt_format == "ids":
            raise ValueError("the chat endpoint needs text prompts")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.vocab_size < 2 or self.timeline_interval_s <= 0 or self.metrics_interval_s <= 0:
            raise ValueError("vocab_size must be >= 2 and intervals > 0")
        if self.num_warmups < 0:
            raise ValueError("num_warmups must be >= 0")


def run_serve_benchmark(config: ServeBenchConfig) -> list[dict]:
    """Runs every phase, writes the files, prints the tables; returns the summaries."""
    return asyncio.run(_bench(config))


async def _bench(config: ServeBenchConfig) -> list[dict]:
    listed = await discover_model(config.base_url, config.api_key)  # fails early without a server
    model = config.model or listed
    endpoint = Endpoint(config.base_url, model, config.endpoint, config.api_key,
                        config.temperature, config.extra_body, config.endpoint_path)
    workload = config.dataset.workload if config.dataset else get_workload(config.workload)
    phases = build_phases(workload, config.options)
    out_dir = Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = []
    for phase in phases:
        _fill_prompts(config, phase.requests)
        await warm_up(endpoint, phase.requests, config.num_warmups)
        result = await run_phase(phase, endpoint, config.max_concurrency,
                                 config.metrics_interval_s)
        summaries.append(_report_phase(config, result, out_dir))
        print(format_summary(f"{config.workload} / {phase.label}", summaries[-1]["summary"]),
              flush=True)
    run_config = {**_describe(config), "model": model,
                  "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_summary_json(run_config, summaries, out_dir / f"{config.workload}-summary.json")
    rated = [(s["rate"], s["summary"]) for s in summaries if s["rate"] is not None]
    if config.plot and len(rated) > 1:
        from parashift.bench.plot import plot_sweep  # matplotlib only when plotting
        plot_sweep(rated, out_dir / f"{config.workload}-sweep.png",
                   f"{config.workload}: latency against request rate")
    return summaries


def _fill_prompts(config: ServeBenchConfig, requests) -> None:
    if config.dataset is not None and config.dataset.prompts is not None:
        config.dataset.fill_prompts(requests)
    elif config.workload in WORKLOADS and get_workload(config.workload).prompts == "repeat":
        fill_repeat_prompts(requests, config.options.seed)  # text: the code to repeat
    elif config.prompt_format == "text":
        fill_text_prompts(requests, config.options.seed)
    else:
        fill_token_prompts(requests, config.options.seed, config.vocab_size)


def _report_phase(config: ServeBenchConfig, result: PhaseResult, out_dir: Path) -> dict:
    stem = f"{config.workload}-{result.phase.label}"
    summary = summarize(result.records, result.duration_s, config.slo)
    rows = build_timeline(result, config.timeline_interval_s)
    summary["peak_output_throughput"] = peak_output_throughput(rows)
    spec = spec_decode_summary(result.server_samples)
    if spec is not None:
        summary["spec_decode"] = spec
    files = {"requests": out_dir / f"{stem}-requests.json",
             "timeline": out_dir / f"{stem}-timeline.csv"}
    write_requests_json(result, files["requests"])
    write_timeline_csv(rows, files["timeline"])
    if config.plot:
        from parashift.bench.plot import plot_timeline  # matplotlib only when plotting
        files["plot"] = out_dir / f"{stem}.png"
        plot_timeline(result, rows, files["plot"], f"{config.workload} / {result.phase.label}"
                      f" ({result.phase.rate or 'as specified'} req/s)")
    return {"label": result.phase.label, "rate": result.phase.rate,
            "num_requests": len(result.records), "max_concurrency": result.max_concurrency,
            "summary": summary, "files": {k: str(v) for k, v in files.items()}}


def _describe(config: ServeBenchConfig) -> dict:
    described = {f.name: getattr(config, f.name) for f in fields(config)
                 if f.name not in ("api_key", "dataset")}
    described["options"] = asdict(config.options)
    described["slo"] = None if config.slo is None else asdict(config.slo)
    described["dataset"] = None if config.dataset is None else config.dataset.workload.description
    return json.loads(json.dumps(described, default=str))
