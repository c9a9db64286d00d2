"""Where a graph-replayed decode step's wall time goes beside its device work (issue 60).

Usage (GPU): PYTHONPATH=. python3 benchmarks/decode_step_timeline.py \
    --model benchmarks/shapes/llama-3.1-8b.json --quantization fp8 --batch-sizes 1 \
    [--graph-variants NAME=VALUE ...] [--patch-variants NAME ...] [--rounds 3] \
    [--no-mixed-graphs] [--no-dot-configs] [--host-profile F] [--output F]

For each batch, variant (decode graphs captured again under each setting, as
decode_throughput.py's --graph-variants, or under a named patch of a launch setting no switch
reads: PATCHES) and round, on one engine:
- `step_ms`: decode_throughput.py's figure (32 engine steps from an idle device, the last step
  waited for: it counts the first step's host launch before the device starts);
  `steady_ms`: the median gap between engine.step() returns after the first three (the
  device's pace once the host runs ahead); `host_ms`: each step's host time less its waits.
- `timeline`: CUDA events around a step's parts as the engine launches them (median µs):
  `inputs` (the step's uploads and copies before its graph), `graph`, `logits` (the LM head,
  eager), `sample` (argmax), `copy_out` (the sampled tokens to the host), `between` (this
  step's last event to the next step's first: idle where the host is late); `period`;
  `host_to_replay_us`: host time from a step's StepGraphs.run to its graph's replay.
- `graph_only_ms`: the decode graph replayed back to back (no host work between);
  `graph_head_ms`: the same with the LM head and argmax after each replay.
`--host-profile F`: cProfile of 32 more engine steps of the first variant (F: the top
functions, by own time and by cumulative time)."""
import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

from benchmarks.decode_throughput import (batch_state, copy_bandwidth, env_settings,
                                          graph_variants, kv_bytes_per_token, start_decodes,
                                          timed_steps, variant_order, weight_bytes_read)
from parashift import LLM
from parashift.attention import triton_backend
from parashift.kernels import fp8_gemm, rmsnorm, silu_mul
from parashift.layers.sampler import Sampler
from parashift.worker.cuda_graphs import Bucket, StepGraphs
from parashift.worker.model_runner import PendingStep

PARTS = ("inputs", "graph", "logits", "sample", "copy_out")
# --patch-variants: decode graphs captured with a module attribute replaced (launch settings
# that no switch reads), by name
PATCHES = {
    "norm_warps_1": (rmsnorm, "num_warps", lambda block: 1),
    "norm_warps_2": (rmsnorm, "num_warps", lambda block: 2),
    "norm_warps_4": (rmsnorm, "num_warps", lambda block: 4),
    "norm_warps_16": (rmsnorm, "num_warps", lambda block: min(max(block // 256, 1), 16)),
    "silu_block_512": (silu_mul, "MAX_BLOCK", 512),
    "silu_block_2048": (silu_mul, "MAX_BLOCK", 2048),
    # SiLU·mul with FP8 rows below 1,024 rows: columns a program (2,048: 7 parts of the 8B's
    # row) and warps (8); the same bits at any (the row's largest magnitude is exact)
    "silu_fp8_block_1024": (silu_mul, "SPLIT_BLOCK", 1024),
    "silu_fp8_block_4096": (silu_mul, "SPLIT_BLOCK", 4096),
    "silu_fp8_warps_4": (silu_mul, "SPLIT_WARPS", 4),
    "silu_fp8_warps_16": (silu_mul, "SPLIT_WARPS", 16),
    "silu_fp8_rows": (silu_mul, "SPLIT_ROWS", 0),  # a program a row (the prefill's kernel)
    # the per-token quantization kernel's warps (o's input at 64 rows: 4); the same bits
    "quant_warps_2": (fp8_gemm, "quantize_warps", lambda k: 2),
    "quant_warps_8": (fp8_gemm, "quantize_warps", lambda k: 8),
    "reduce_warps_1": (triton_backend, "REDUCE_WARPS", 1),
    "reduce_warps_2": (triton_backend, "REDUCE_WARPS", 2),
    "reduce_warps_8": (triton_backend, "REDUCE_WARPS", 8),
}
MARKS = ("run", "replay", "replayed", "logits", "sampled", "copied")  # events, in stream order


class StepMarks:
    """CUDA events recorded at the marks of each step the engine launches while `on`, and the
    host's time from StepGraphs.run to the replay."""

    def __init__(self, model):
        self.model, self.on, self.steps, self.host_us = model, False, [], []
        self._saved = []

    def _mark(self, name: str) -> None:
        if not self.on:
            return
        if name == "run":
            self.steps.append({})
        elif not self.steps or name in self.steps[-1]:  # a step without a graph
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.steps[-1][name] = event

    def __enter__(self):
        marks = self
        run, replay = StepGraphs.run, torch.cuda.CUDAGraph.replay
        logits, argmax, pending = self.model.compute_logits, Sampler.argmax, PendingStep.__init__

        def timed_run(graphs, *args, **kwargs):
            marks._mark("run")
            marks._run_start = time.perf_counter()
            return run(graphs, *args, **kwargs)

        def timed_replay(graph):
            if marks.on and marks.steps and "replay" not in marks.steps[-1]:
                marks.host_us.append(1e6 * (time.perf_counter() - marks._run_start))
            marks._mark("replay")
            replay(graph)
            marks._mark("replayed")

        def timed_logits(hidden):
            out = logits(hidden)
            marks._mark("logits")
            return out

        def timed_argmax(values):
            out = argmax(values)
            marks._mark("sampled")
            return out

        def timed_pending(step, *args, **kwargs):
            pending(step, *args, **kwargs)
            if args and args[0] is not None:
                marks._mark("copied")

        self._saved = [(StepGraphs, "run", run), (torch.cuda.CUDAGraph, "replay", replay),
                       (self.model, "compute_logits", logits), (PendingStep, "__init__", pending)]
        StepGraphs.run, torch.cuda.CUDAGraph.replay = timed_run, timed_replay
        self.model.compute_logits, PendingStep.__init__ = timed_logits, timed_pending
        Sampler.argmax = staticmethod(timed_argmax)
        self._argmax = argmax
        return self

    def __exit__(self, *exc):
        for owner, name, value in self._saved:
            setattr(owner, name, value)
        Sampler.argmax = staticmethod(self._argmax)
        if "compute_logits" in vars(self.model):
            del self.model.compute_logits

    def summary(self) -> dict:
        torch.cuda.synchronize()
        full = [s for s in self.steps if all(m in s for m in MARKS)]
        parts = {name: [] for name in (*PARTS, "between", "period")}
        for step, after in zip(full, full[1:] + [None]):
            for name, (a, b) in zip(PARTS, zip(MARKS, MARKS[1:])):
                parts[name].append(1e3 * step[a].elapsed_time(step[b]))
            if after is not None:
                parts["between"].append(1e3 * step["copied"].elapsed_time(after["run"]))
                parts["period"].append(1e3 * step["run"].elapsed_time(after["run"]))
        out = {name: round(statistics.median(v), 2) for name, v in parts.items() if v}
        out["steps"] = len(full)
        if self.host_us:
            out["host_to_replay_us"] = round(statistics.median(self.host_us), 1)
        return out


def patch_variants(runner, names: list[str]) -> dict:
    """Decode graphs captured under each named patch (decode steps' only, as
    decode_throughput.graph_variants captures them)."""
    graphs = {}
    mixed, runner.config.mixed_step_graphs = runner.config.mixed_step_graphs, False
    try:
        for name in names:
            owner, attr, value = PATCHES[name]
            saved = getattr(owner, attr)
            setattr(owner, attr, value)
            try:
                graphs[name] = runner._capture_graphs()
            finally:
                setattr(owner, attr, saved)
    finally:
        runner.config.mixed_step_graphs = mixed
    return graphs


def engine_steps(engine, steps: int) -> dict:
    """decode_throughput.py's step_ms of `steps` engine steps, and the steady pace."""
    elapsed, gaps, host_ms = timed_steps(engine, steps)
    return dict(step_ms=round(1e3 * elapsed, 4), steady_ms=round(statistics.median(gaps[3:]), 4),
                steady_mean_ms=round(statistics.fmean(gaps[3:]), 4), host_ms=round(host_ms, 3),
                step_ms_each=[round(g, 3) for g in gaps])


def replay_ms(graphs: StepGraphs, batch: int, model, head: bool, count: int = 100) -> float:
    """ms a replay of the decode graph of `batch` rows, back to back (with `head`: the LM head
    and argmax after each). The graph's inputs are the last step's: it writes the same key and
    value to the same slot again."""
    size = graphs.bucket_of(batch)
    (graph, hidden), = [v for (_, bucket), v in graphs.graphs.items()
                        if bucket == Bucket(size, size)][:1]
    rows = hidden[:batch]

    def once():
        graph.replay()
        if head:
            Sampler.argmax(model.compute_logits(rows))
    for _ in range(5):
        once()
    torch.cuda.synchronize()
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    for _ in range(count):
        once()
    end.record()
    end.synchronize()
    return round(start.elapsed_time(end) / count, 4)


def breakdown(engine, batch: int, steps: int) -> dict:
    runner = engine.runner
    with StepMarks(runner.model) as marks:
        marks.on = True
        for _ in range(steps):
            engine.step()
        marks.on = False
        timeline = marks.summary()
    return dict(timeline=timeline,
                graph_only_ms=replay_ms(runner.graphs, batch, runner.model, head=False),
                graph_head_ms=replay_ms(runner.graphs, batch, runner.model, head=True))


def host_profile(engine, steps: int, path: str) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(30)
    with open(path, "w") as f:
        f.write(f"{steps} engine steps\n" + text.getvalue())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--timeline-steps", type=int, default=24)
    p.add_argument("--quantization", default=None)
    p.add_argument("--graph-variants", nargs="+", default=[], type=env_settings)
    p.add_argument("--patch-variants", nargs="+", default=[], choices=sorted(PATCHES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-mixed-graphs", action="store_true",
                   help="no mixed-step graphs (a shorter start-up; decode steps replay the same "
                   "decode graphs)")
    p.add_argument("--no-dot-configs", action="store_true",
                   help="FP8: leave fp8_gemm.py's tl.dot configs out of the GEMM choice")
    p.add_argument("--host-profile", default=None)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if args.no_dot_configs:
        fp8_gemm.CONFIGS = ()
    start = time.perf_counter()
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.context + 1024,
              max_num_seqs=max(args.batch_sizes), skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=True, quantization=args.quantization,
              mixed_step_graphs=not args.no_mixed_graphs)
    engine = llm.llm_engine
    runner = engine.runner
    print(json.dumps({"start_up_s": round(time.perf_counter() - start, 1)}), flush=True)
    cfg = runner.model.config
    bandwidth = copy_bandwidth(engine.device)
    graphs = {**graph_variants(runner, args.graph_variants),
              **patch_variants(runner, args.patch_variants)}
    rows = []
    for batch in args.batch_sizes:
        for round_, name in variant_order(list(graphs), args.rounds):
            runner.graphs = graphs[name]
            ids = start_decodes(engine, batch, args.context, cfg.vocab_size)
            before = batch_state(engine)
            row = dict(batch=batch, variant=name, round=round_,
                       **engine_steps(engine, args.decode_steps))
            try:  # the breakdown beside step_ms: a failure here leaves the A/B's figures
                row.update(breakdown(engine, batch, args.timeline_steps))
                if args.host_profile and round_ == 0 and name == "default":
                    host_profile(engine, 32, f"{args.host_profile}.b{batch}.txt")
            except Exception as exc:  # noqa: BLE001 - reported in the row
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            after = batch_state(engine)
            if not before["running"] == after["running"] == batch:
                raise RuntimeError(f"the batch changed while timed: {before} -> {after}")
            context = (before["context_tokens"] + after["context_tokens"]) / 2 / batch
            kv = batch * context * kv_bytes_per_token(cfg, 2)
            row["floor_ms"] = round(1e3 * (weight_bytes_read(runner.model, batch) + kv)
                                    / bandwidth, 4)
            row["fraction_of_floor"] = round(row["floor_ms"] / row["step_ms"], 4)
            for rid in ids:
                engine.abort_request(rid)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "step_ms_each"}), flush=True)
    runner.graphs = graphs["default"]
    medians = {}
    for row in rows:
        medians.setdefault((row["batch"], row["variant"]), []).append(row)
    summary = [dict(batch=b, variant=v, rounds=len(r),
                    **{key: round(statistics.median(x[key] for x in r), 4)
                       for key in ("step_ms", "steady_ms", "graph_only_ms", "graph_head_ms")
                       if all(key in x for x in r)})
               for (b, v), r in medians.items()]
    out = dict(model=args.model, quantization=args.quantization, device=torch.cuda.get_device_name(),
               copy_bandwidth_tb_s=bandwidth / 1e12, fp8_gemm=fp8_gemm.chosen(), rows=rows,
               summary=summary)
    print(json.dumps(summary, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
