"""`parashift plan --simulate`: the real engine (scheduler, node, policies, transitions)
driven by the cost model instead of devices, as a discrete-event run of a workload's
arrivals on a virtual clock (sim_executor.py). It reports what `bench serve` reports."""
import contextlib
import importlib
from dataclasses import dataclass, field, replace

from parashift.bench.workloads import BenchRequest
from parashift.config import EngineConfig
from parashift.cost.step import StepModel
from parashift.planner.sim_executor import VirtualClock, SimulatedExecutor
from parashift.sampling_params import SamplingParams

# the engine's modules that read the time (`import time`): the virtual clock replaces it
CLOCKED = ("parashift.engine.llm_engine", "parashift.engine.replica",
           "parashift.engine.node_view", "parashift.engine.scheduler",
           "parashift.engine.sequence", "parashift.engine.node_transitions",
           "parashift.engine.transitions")


@dataclass
class Simulated:
    """Per request: (arrival, first token, end, output tokens, priority, input); the steps."""
    requests: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    duration_s: float = 0.0


@contextlib.contextmanager
def simulated_engine(config: EngineConfig, model: StepModel):
    """An LLMEngine whose executor is simulated and whose modules read a virtual clock."""
    clock = VirtualClock()
    modules = [importlib.import_module(name) for name in CLOCKED]
    saved = [m.time for m in modules]
    engine_module = importlib.import_module("parashift.engine.llm_engine")
    make_executor = engine_module.make_executor
    made = []

    def make(config, hf_config, source, layout, plans, device, dtype, max_model_len):
        made.append(SimulatedExecutor(model, clock, list(plans), list(layout.plans),
                                      config.block_size, config.num_blocks, config.cuda_graphs))
        return made[-1]
    for m in modules:
        m.time = clock
    engine_module.make_executor = make
    try:
        from parashift.engine.llm_engine import LLMEngine
        engine = LLMEngine(replace(config, skip_tokenizer_init=True, load_format="dummy",
                                   output_processor="inline", async_scheduling=False))
        try:
            yield engine, made[0], clock
        finally:
            engine.shutdown()
    finally:
        engine_module.make_executor = make_executor
        for m, original in zip(modules, saved):
            m.time = original


def simulate(config: EngineConfig, model: StepModel, requests: list[BenchRequest]) -> Simulated:
    """Runs `requests` (arrival_s, input_len, output_len, priority) through the engine."""
    order = sorted(requests, key=lambda r: (r.arrival_s, r.index))
    out = Simulated()
    with simulated_engine(config, model) as (engine, executor, clock):
        vocab = engine.vocab_size
        records = {}
        pending = list(reversed(order))
        while pending or engine.has_unfinished_requests():
            if not engine.has_unfinished_requests() and pending[-1].arrival_s > clock.now:
                clock.now = pending[-1].arrival_s  # idle until the next arrival
            while pending and pending[-1].arrival_s <= clock.now:
                req = pending.pop()
                prompt = [(req.index * 31 + k) % (vocab - 1) + 1 for k in range(req.input_len)]
                engine.add_request(str(req.index), prompt, SamplingParams(
                    temperature=0.0, max_tokens=req.output_len, ignore_eos=True),
                    priority=req.priority)
                records[str(req.index)] = {"index": req.index, "arrival_s": req.arrival_s,
                                           "input_len": req.input_len, "priority": req.priority,
                                           "first_token_s": None, "end_s": None, "tokens": 0,
                                           "token_times": []}
            for output in engine.step():
                record = records[output.request_id]
                count = len(output.outputs[0].token_ids) if output.outputs else 0
                if count > record["tokens"]:
                    record["token_times"] += [clock.now] * (count - record["tokens"])
                    record["tokens"] = count
                    record["first_token_s"] = record["first_token_s"] or clock.now
                if output.finished:
                    record["end_s"] = clock.now
        out.requests = sorted(records.values(), key=lambda r: r["index"])
        out.steps = executor.steps
        out.duration_s = clock.now - (order[0].arrival_s if order else 0.0)
    return out


def bench_records(sim: Simulated):
    """The run as `bench serve`'s request records (parashift/bench/client.py)."""
    from parashift.bench.client import RequestRecord
    records = []
    for r in sim.requests:
        record = RequestRecord(r["index"], r["input_len"], r["tokens"], r["arrival_s"],
                               start_s=r["arrival_s"], first_token_s=r["first_token_s"],
                               end_s=r["end_s"], chunk_times=r["token_times"],
                               prompt_tokens=r["input_len"], output_tokens=r["tokens"],
                               finish_reason="length", success=r["end_s"] is not None,
                               priority=r["priority"])
        records.append(record)
    return records
