"""`parashift bench throughput`: an offline workload through `parashift.LLM`, in
process, no HTTP. Reports requests/s and input, output and total tokens/s."""
import json
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

from parashift.bench.prompts import fill_repeat_prompts, fill_token_prompts
from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload


@dataclass
class ThroughputConfig:
    workload: str
    engine_options: dict = field(default_factory=dict)  # EngineConfig fields
    options: WorkloadOptions = field(default_factory=WorkloadOptions)
    temperature: float = 0.0
    output_json: str | None = None

    def __post_init__(self):
        workload = get_workload(self.workload)
        if not workload.offline:
            raise ValueError(f"workload {self.workload!r} is not offline (its requests do not "
                             "all arrive at t=0); use `parashift bench serve`")
        if self.options.request_rates:
            raise ValueError("bench throughput takes no request rate: all requests start at once")


def run_throughput_benchmark(config: ThroughputConfig) -> dict:
    from parashift.entrypoints.llm import LLM
    from parashift.sampling_params import SamplingParams

    llm = LLM(**config.engine_options)
    workload = get_workload(config.workload)
    requests = build_phases(workload, config.options)[0].requests
    if workload.prompts == "repeat":  # the code to repeat, in the model's chat template
        fill_repeat_prompts(requests, config.options.seed)
        for r in requests:
            r.prompt = llm.llm_engine.apply_chat_template([{"role": "user", "content": r.prompt}])
    else:
        fill_token_prompts(requests, config.options.seed, llm.llm_engine.vocab_size)
    params = [SamplingParams(temperature=config.temperature, max_tokens=r.output_len,
                             ignore_eos=r.ignore_eos, seed=config.options.seed + r.index)
              for r in requests]
    start = time.perf_counter()
    outputs = llm.generate([r.prompt for r in requests], params)
    elapsed = time.perf_counter() - start
    result = _result(config, requests, outputs, elapsed)
    spec = llm.llm_engine.spec_decode_stats()
    if spec is not None:  # speculative decoding's acceptance
        result["spec_decode"] = {"method": spec.method, "num_drafts": spec.num_drafts,
                                 "num_draft_tokens": spec.num_draft_tokens,
                                 "num_accepted_tokens": spec.num_accepted_tokens,
                                 "acceptance_rate": round(spec.acceptance_rate, 4),
                                 "mean_accepted_length": round(spec.mean_accepted_length, 3)}
    if llm.llm_engine.config.sidp.share_ffn:  # SiDP: its rounds (a round waits for every replica)
        result["shared_ffn_rounds"] = {key: value for key, value in llm.llm_engine.executor
                                       .collective_rpc("shared_ffn_stats")[0].items()
                                       if key.endswith("_rounds")}
    print(_format(result), flush=True)
    if config.output_json:
        Path(config.output_json).write_text(json.dumps(result, indent=2))
    return result


def _result(config: ThroughputConfig, requests, outputs, elapsed: float) -> dict:
    input_tokens = sum(len(r.prompt) for r in requests)
    output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"workload": config.workload, "num_requests": len(requests),
            "elapsed_s": elapsed, "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "request_throughput": len(requests) / elapsed,
            "input_throughput": input_tokens / elapsed,
            "output_throughput": output_tokens / elapsed,
            "total_token_throughput": (input_tokens + output_tokens) / elapsed,
            "options": vars(config.options),
            "engine_options": {key: asdict(value) if is_dataclass(value) else value
                               for key, value in config.engine_options.items()}}


def _format(result: dict) -> str:
    return (f"{result['workload']}: {result['num_requests']} requests in "
            f"{result['elapsed_s']:.2f} s: {result['request_throughput']:.2f} req/s, "
            f"{result['total_token_throughput']:.1f} tok/s total "
            f"({result['input_throughput']:.1f} in, {result['output_throughput']:.1f} out)"
            + "".join(f", {key.replace('_', ' ')} {value}"
                      for key, value in result.get("shared_ffn_rounds", {}).items())
            + "".join(f", {key.replace('_', ' ')} {value}"
                      for key, value in result.get("spec_decode", {}).items()))
