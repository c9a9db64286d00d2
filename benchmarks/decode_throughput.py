"""Decode throughput at fixed batch sizes and context, beside the HBM floor.

Usage (GPU): python3 benchmarks/decode_throughput.py --model benchmarks/shapes/llama-3.1-8b.json \
    --batch-sizes 1 16 64 256 --context 1024 --decode-steps 32 [--plan tp2|dp2|shift2|...]
Random weights (speed only). Floor = (weight bytes + KV bytes read) / measured copy bandwidth,
the input embedding counted as the rows a step gathers, not its table (`floor_ms`; until session
46 the whole table counted, as every parameter did: `floor_ms_whole_embedding` keeps that);
the operation floor (`operation_floor`) counts each GEMM's larger of bytes and FLOPs instead;
a mixture of experts' weight bytes count the experts a step touches (`weight_bytes_read`).
Under a plan of several GPUs (`--plan`, benchmarks/plans.py's names) the floor is one GPU's
share, the busiest: a TP or SP group of t ranks reads weights / t (SP: the TP-layout decode of
Shift; plain SP holds every weight) and KV / t; a DP replica reads every weight and its half of
the KV. Dense models only there (weights counted from the config on the meta device).
--graph-variants NAME=VALUE[,NAME=VALUE] ...: one engine, its decode graphs captured again
under each setting (the environment switches a launch reads, e.g. PARASHIFT_PDL; the GEMM
choices made at start-up kept); each batch is measured in every variant in turn, --rounds
times (an A/B without a second start-up, the order alternating against drift); --profile
profiles the first round of each of --profile-variants."""
import argparse
import contextlib
import json
import os
import random
import statistics
import time

import torch

from parashift.kernels import fp8_gemm

from parashift import LLM, SamplingParams
from parashift.kernels import dense_gated_choice, dense_gemm, fp8_gated_choice, gated_gemv, \
    pdl, skinny_gemm, split_parts_choice


def copy_bandwidth(device) -> float:
    """Bytes read + written per second of a large device-to-device copy."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 10 / (time.perf_counter() - start)


def weight_bytes_read(model, batch: int, whole_embedding: bool = False) -> float:
    """The weight bytes a decode step of `batch` sequences reads: every parameter, except
    that the input embedding gives one row a sequence (its whole table where it is the LM
    head's too, or with `whole_embedding`), and a mixture of experts' layer reads only the
    experts its tokens pick, E·(1 − (1 − k/E)^B) of its E in expectation under uniform
    routing (random weights route about so)."""
    from parashift.layers.fused_moe import FusedMoE
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not whole_embedding:
        total -= unread_embedding_bytes(model, batch)
    for layer in (m for m in model.modules() if isinstance(m, FusedMoE)):
        experts = layer.experts.gate_up_proj.shape[0]
        expert_bytes = sum(p.numel() * p.element_size() for p in layer.experts.parameters())
        touched = experts * (1 - (1 - layer.top_k / experts) ** batch)
        total -= expert_bytes * (1 - touched / experts)
    return total


def unread_embedding_bytes(model, batch: int) -> float:
    """The input embedding's bytes a step does not gather (none where the LM head shares it)."""
    from parashift.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    head_weights = {id(m.weight) for m in model.modules() if isinstance(m, ParallelLMHead)}
    unread = 0.0
    for table in (m for m in model.modules() if type(m) is VocabParallelEmbedding):
        if id(table.weight) not in head_weights:
            rows = min(batch, table.weight.shape[0])
            unread += (table.weight.shape[0] - rows) * table.weight[0].numel() * table.weight.element_size()
    return unread


def operation_floor(model, batch: int, kv_bytes: float, bandwidth: float) -> float:
    """Seconds of a decode step's floor counting each GEMM's larger of its weight bytes over
    the copy bandwidth and its 2·batch·N·K FLOPs over the bf16 matrix rate (the linear layers
    and the LM head: one row a sequence); the other weight bytes read and the KV bytes over
    the bandwidth. Tied weights count once, as in `weight_bytes_read`."""
    from prefill_throughput import BF16_MATRIX_RATE
    from parashift.layers.embedding import ParallelLMHead
    from parashift.layers.linear import LinearBase
    gemms = {id(m.weight): m.weight for m in model.modules()
             if isinstance(m, (LinearBase, ParallelLMHead)) and m.weight.dim() == 2}
    gemm_bytes = sum(w.numel() * w.element_size() for w in gemms.values())
    rest = weight_bytes_read(model, batch) - gemm_bytes + kv_bytes
    return rest / bandwidth + sum(max(w.numel() * w.element_size() / bandwidth,
                                      2 * batch * w.numel() / BF16_MATRIX_RATE)
                                  for w in gemms.values())


def dense_weight_bytes(hf_config) -> int:
    """Every parameter's bf16 bytes (tied weights once) but an untied input embedding's (its
    rows a step reads are negligible), counted on the meta device."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    tied = getattr(hf_config, "tie_word_embeddings", False)
    unread = 0 if tied else model.get_input_embeddings().weight.numel()  # a row a sequence
    return 2 * (sum(p.numel() for p in model.parameters()) - unread)


def plan_floor_bytes(weights: int, plan: dict, kv_bytes: float) -> float:
    """One GPU's bytes read per decode step under a plan of several ranks (module docstring)."""
    group = plan.get("tensor_parallel_size", 1) * plan.get("sequence_parallel_size", 1)
    replicas = plan.get("data_parallel_size", 1)
    stages = plan.get("pipeline_parallel_size", 1)
    return weights / stages / group + kv_bytes / replicas / stages / group


def kv_bytes_per_token(cfg, dtype_bytes: int) -> int:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * dtype_bytes


def measure(llm: LLM, batch: int, context: int, steps: int, vocab: int,
            profile: bool = False) -> tuple[float, float, dict | None, float]:
    """Seconds per engine step with `batch` sequences at ~`context` tokens, their mean
    context over the timed steps, with `profile` the kernel breakdown of a few more, and the
    tokens decoded per second (from the contexts' growth: an engine step of a DP plan steps
    one replica, not the whole batch)."""
    engine = llm.llm_engine
    ids = start_decodes(engine, batch, context, vocab)
    torch.cuda.synchronize()
    before = batch_state(engine)
    elapsed, gaps, host_ms = timed_steps(engine, steps)
    after = batch_state(engine)
    print(json.dumps({"batch": batch, "host_ms_per_step": round(host_ms, 3),
                      "step_ms_each": [round(g, 2) for g in gaps],
                      "before_timed": before, "after_timed": after}), flush=True)
    breakdown = kernel_breakdown(llm) if profile else None
    if profile:
        breakdown["after_profile"] = batch_state(engine)
        if breakdown["after_profile"]["running"] != batch:
            raise RuntimeError(f"the batch changed while profiled: {breakdown}")
    if not before["running"] == after["running"] == batch:
        raise RuntimeError(f"the batch changed while timed: {before} -> {after}")
    mean_context = (before["context_tokens"] + after["context_tokens"]) / 2 / batch
    tokens_per_s = (after["context_tokens"] - before["context_tokens"]) / (elapsed * steps)
    for rid in ids:
        engine.abort_request(rid)
    return elapsed, mean_context, breakdown, tokens_per_s


def timed_steps(engine, steps: int) -> tuple[float, list[float], float]:
    """Seconds a step over `steps` engine steps from an idle device to the last one's end,
    the wall ms between step() returns, and the host's ms a step less its waits."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    ends = []
    with device_waits() as waited:
        for _ in range(steps):
            engine.step()
            ends.append(time.perf_counter())
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / steps
    gaps = [1e3 * (b - a) for a, b in zip([start] + ends, ends)]
    return elapsed, gaps, 1e3 * (elapsed - waited[0] / steps)


def start_decodes(engine, batch: int, context: int, vocab: int) -> list[str]:
    """Adds `batch` random prompts of `context` tokens and steps until every one has
    prefilled and decoded 3 tokens; returns their request ids."""
    rng = random.Random(batch)
    # Sequences admitted early decode while later ones prefill: leave them room, so none
    # finishes (and shrinks the batch) before the timed steps are over.
    params = SamplingParams(temperature=0, ignore_eos=True,
                            max_tokens=engine.max_model_len - context)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, [rng.randrange(vocab) for _ in range(context)], params)
    while any(r.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                         for s in r.scheduler.running) for r in engine.replicas):
        engine.step()
    for _ in range(3):
        engine.step()
    return ids


@contextlib.contextmanager
def device_waits():
    """Sums the seconds the host blocks on step results (PendingStep.result) into the
    yielded list's one item. Wall time minus that is the host's own work: when it is
    near the step time, the host, not the GPU, sets the pace."""
    from parashift.worker.model_runner import PendingStep
    original, total = PendingStep.result, [0.0]

    def timed(self):
        start = time.perf_counter()
        try:
            return original(self)
        finally:
            total[0] += time.perf_counter() - start

    PendingStep.result = timed
    try:
        yield total
    finally:
        PendingStep.result = original


def batch_state(engine) -> dict:
    """What the timed steps ran on (every replica's): a preempted sequence would shrink
    the batch."""
    running = [s for r in engine.replicas for s in r.scheduler.running]
    return dict(running=len(running), waiting=sum(len(r.scheduler.waiting) for r in engine.replicas),
                context_tokens=sum(s.num_computed_tokens for s in running))


def kernel_breakdown(llm: LLM, steps: int = 5, top: int = 20) -> dict:
    """GPU kernel time per decode step (torch.profiler, device activity only: recording host
    ops slows the host enough to open gaps that an unprofiled run does not have) beside the
    step's wall time, and the kernel timeline's span per step with the idle gaps inside it."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    engine = llm.llm_engine
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    per_name: dict[str, float] = {}
    per_launch: dict[str, list[float]] = {}  # by name and grid: a GEMM's projections apart
    for e in kernels:
        per_name[e["name"][:70]] = per_name.get(e["name"][:70], 0.0) + e["dur"]
        launch = f'{e["name"][:50]} grid {e.get("args", {}).get("grid")}'
        per_launch.setdefault(launch, []).append(e["dur"])
    gaps = [b["ts"] - a["ts"] - a["dur"] for a, b in zip(kernels, kernels[1:])]
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"] if kernels else 0.0
    ms = 1e-3 / steps  # trace microseconds summed over the steps -> ms per step
    return dict(profiled_wall_ms=wall * 1e3, gpu_busy_ms=sum(per_name.values()) * ms,
                kernel_span_ms=span * ms, idle_gaps_over_8us_ms=sum(g for g in gaps if g > 8) * ms,
                top_kernels=[(name, round(t * ms, 3)) for name, t in
                             sorted(per_name.items(), key=lambda kv: -kv[1])[:top]],
                top_launches=[dict(kernel=name, ms=round(sum(t) * ms, 4),
                                   calls=round(len(t) / steps, 2),
                                   mean_us=round(sum(t) / len(t), 2))
                              for name, t in sorted(per_launch.items(),
                                                    key=lambda kv: -sum(kv[1]))[:2 * top]],
                # the first step's first kernels in order (a layer's, each projection apart)
                first_kernels=[(e["name"][:40], e.get("args", {}).get("grid"), e["dur"],
                                round(b["ts"] - e["ts"] - e["dur"], 2))
                               for e, b in zip(kernels[:40], kernels[1:41])])


def env_settings(text: str) -> str:
    """Checks NAME=VALUE[,NAME=VALUE]."""
    parse_settings(text)
    return text


def parse_settings(text: str) -> dict[str, str]:
    settings = dict(item.partition("=")[::2] for item in text.split(","))
    if not all(name.isidentifier() and "=" in item
               for name, item in zip(settings, text.split(","))):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE[,NAME=VALUE]")
    return settings


@contextlib.contextmanager
def environment(settings: dict[str, str]):
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def graph_variants(runner, variants: list[str]) -> dict:
    """The runner's decode graphs ("default") and each variant's, captured under its
    settings (the runner's private capture, as world_reform's, for a benchmark's A/B).
    A variant's graphs are decode steps' only (its prompts' steps run eagerly: less
    memory beside the KV pool); one that does not fit in memory is left out."""
    graphs = {"default": runner.graphs}
    if variants and runner.graphs is None:
        raise RuntimeError("--graph-variants: the engine replays no CUDA graphs")
    mixed, runner.config.mixed_step_graphs = runner.config.mixed_step_graphs, False
    try:
        for variant in variants:
            with environment(parse_settings(variant)):
                try:
                    graphs[variant] = runner._capture_graphs()
                except torch.cuda.OutOfMemoryError as exc:
                    print(json.dumps({"variant_left_out": variant, "error": str(exc)[:200]}))
                    torch.cuda.empty_cache()
    finally:
        runner.config.mixed_step_graphs = mixed
    return graphs


def variant_order(names: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, variant) in measuring order: the variants in turn, every other round reversed
    (A B, B A, A B ...)."""
    return [(r, name) for r in range(rounds) for name in (names if r % 2 == 0 else names[::-1])]


def variant_medians(rows: list[dict]) -> list[dict]:
    """Each (batch, variant)'s median step over its rounds, and its ratio to the default's."""
    medians = {}
    for row in rows:
        medians.setdefault((row["batch"], row["variant"]), []).append(row["step_ms"])
    out = []
    for (batch, name), steps in medians.items():
        step = statistics.median(steps)
        base = statistics.median(medians[(batch, "default")])
        out.append(dict(batch=batch, variant=name, step_ms=round(step, 4), rounds=len(steps),
                        default_over_this=round(base / step, 4)))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: context + 1024 (it sets the split-KV count of captured graphs)")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on where possible (CUDA, triton attention)")
    p.add_argument("--profile", action="store_true", help="add a GPU kernel breakdown per batch")
    p.add_argument("--deterministic", action="store_true", help="batch- and plan-invariant kernels")
    p.add_argument("--plan", default="single", help="benchmarks/plans.py's names: tp2, dp2, shift2")
    p.add_argument("--quantization", default=None, help="fp8: FP8 weights (quantized at load)")
    p.add_argument("--kv-cache-dtype", default="auto", help="fp8: E4M3 KV pages")
    p.add_argument("--graph-variants", nargs="+", default=[], type=env_settings,
                   metavar="NAME=VALUE[,NAME=VALUE]",
                   help="decode graphs captured again under these settings, measured in turn")
    p.add_argument("--rounds", type=int, default=1, help="with --graph-variants")
    p.add_argument("--profile-variants", nargs="+", default=["default"],
                   help="with --graph-variants and --profile: the variants profiled (their first "
                   "round), e.g. PARASHIFT_PDL=0 for each kernel's own time")
    p.add_argument("--no-dot-configs", action="store_true",
                   help="FP8: leave fp8_gemm.py's tl.dot configs out of the GEMM choice (never "
                   "chosen above 4 rows since the TMA kernel): a shorter start-up for an A/B")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if args.no_dot_configs:
        fp8_gemm.CONFIGS = ()
    if args.graph_variants and (args.plan != "single" or args.cuda_graphs is False):
        p.error("--graph-variants needs one device's engine with CUDA graphs")
    if not set(args.profile_variants) <= {"default", *args.graph_variants}:
        p.error(f"--profile-variants {args.profile_variants} are not all of --graph-variants")
    if args.plan != "single":
        return main_plan(args)
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.max_model_len or args.context + 1024,
              max_num_seqs=max(args.batch_sizes), skip_tokenizer_init=True,
              attention_backend=args.attention_backend, enable_prefix_caching=False,
              cuda_graphs=args.cuda_graphs, deterministic=args.deterministic,
              quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
    engine = llm.llm_engine
    cfg = engine.runner.model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    bandwidth = copy_bandwidth(engine.device)
    kv_dtype_bytes = 1 if args.kv_cache_dtype.startswith("fp8") else 2
    kv_capacity = sum(r.block_manager.num_blocks * r.block_manager.block_size for r in engine.replicas)
    graphs = graph_variants(engine.runner, args.graph_variants)
    rows = []
    for batch in args.batch_sizes:
        for round_, name in variant_order(list(graphs), args.rounds):
            engine.runner.graphs = graphs[name]
            seconds, context, breakdown, _ = measure(
                llm, batch, args.context, args.decode_steps, cfg.vocab_size,
                profile=args.profile and round_ == 0 and name in args.profile_variants)
            kv = batch * context * kv_bytes_per_token(cfg, kv_dtype_bytes)
            floor = (weight_bytes_read(engine.runner.model, batch) + kv) / bandwidth
            whole = (weight_bytes_read(engine.runner.model, batch, True) + kv) / bandwidth
            op_floor = operation_floor(engine.runner.model, batch, kv, bandwidth)
            rows.append(dict(batch=batch, context=args.context, mean_context=context,
                             step_ms=seconds * 1e3, tokens_per_s=batch / seconds,
                             floor_ms=floor * 1e3, fraction_of_floor=floor / seconds,
                             floor_ms_whole_embedding=whole * 1e3,
                             fraction_of_floor_whole_embedding=whole / seconds,
                             op_floor_ms=op_floor * 1e3, fraction_of_op_floor=op_floor / seconds,
                             profile=breakdown,
                             **(dict(variant=name, round=round_) if len(graphs) > 1 else {})))
            print(json.dumps(rows[-1]), flush=True)
    engine.runner.graphs = graphs["default"]
    summary = dict(model=args.model, device=torch.cuda.get_device_name(),
                   quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
                   kv_capacity_tokens=kv_capacity, fp8_gemm=fp8_gemm.chosen(),
                   backend=engine.runner.backend.name, cuda_graphs=engine.runner.graphs is not None,
                   deterministic=args.deterministic,
                   pdl=pdl.pdl_enabled(torch.device(engine.device)),
                   copy_bandwidth_tb_s=bandwidth / 1e12, weight_gb=weight_bytes / 1e9,
                   skinny_gemm=skinny_gemm.chosen(), gated_gemv=gated_gemv.chosen(),
                   dense_gemm=dense_gemm.chosen(),
                   fp8_gated=fp8_gated_choice.chosen(),
                   dense_gated=dense_gated_choice.chosen(),
                   split_parts_norm=split_parts_choice.chosen(), rows=rows,
                   **(dict(variants=variant_medians(rows)) if len(graphs) > 1 else {}))
    print(json.dumps({"skinny_gemm": summary["skinny_gemm"]}))
    print(json.dumps(summary, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


def main_plan(args):
    """Decode steps under a plan of several ranks (no in-process runner: no kernel profile)."""
    from plans import plan_options
    from parashift.loader.source import load_hf_config, resolve_model
    options = plan_options(args.plan)
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.max_model_len or args.context + 1024,
              max_num_seqs=max(args.batch_sizes), skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=args.cuda_graphs,
              deterministic=args.deterministic, **options)
    cfg = load_hf_config(resolve_model(args.model))
    weights = dense_weight_bytes(cfg)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    rows = []
    for batch in args.batch_sizes:
        seconds, context, _, tokens_per_s = measure(llm, batch, args.context, args.decode_steps,
                                                    cfg.vocab_size)
        kv = batch * context * kv_bytes_per_token(cfg, 2)
        # one step of every replica at once, each over its share of the batch
        floor = plan_floor_bytes(weights, options, kv) / bandwidth
        rows.append(dict(plan=args.plan, batch=batch, context=args.context, mean_context=context,
                         engine_step_ms=seconds * 1e3, tokens_per_s=tokens_per_s,
                         floor_ms=floor * 1e3, floor_tokens_per_s=batch / floor,
                         fraction_of_floor=tokens_per_s * floor / batch))
        print(json.dumps(rows[-1]), flush=True)
    summary = dict(model=args.model, plan=args.plan, device=torch.cuda.get_device_name(),
                   deterministic=args.deterministic,
                   copy_bandwidth_tb_s=bandwidth / 1e12, rows=rows)
    llm.llm_engine.shutdown()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
