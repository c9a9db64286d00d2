"""The best a design of one kernel an operation reaches for a whole decode step (issue 60).

Usage (GPU): PYTHONPATH=. python3 benchmarks/step_ceiling.py \
    --model benchmarks/shapes/llama-3.1-8b.json [--quantization fp8] --batch-sizes 1 64 \
    [--context 1024] [--rounds 3] [--graph-variants NAME=VALUE ...]
    [--patch-variants NAME ...] [--profile-variants NAME ...] [--no-dot-configs] [--output F]

One engine (decode graphs captured only for --batch-sizes: `cuda_graphs.DEFAULT_BUCKETS`
patched here, a shorter start-up). For each batch:
- the engine's step: decode_throughput.py's `step_ms` (rounds of 32 steps; with
  --graph-variants each variant's in turn, as decode_throughput.py measures them), the decode
  graph replayed back to back with the LM head and argmax (`graph_head_ms`), the floor (bytes
  read over the copy bandwidth, decode_throughput.py's convention), and the kernels of one
  step in launch order (torch.profiler: name, grid, µs, summed by operation: under PDL a
  kernel's span includes its wait for the one before; --profile-variants PARASHIFT_PDL=0
  gives each kernel's own time).
- the ceiling: the same kernels, as many and in the same order, each replaced by a kernel that
  only reads the bytes its operation must read, in one CUDA graph with PDL as the engine
  launches (`ceiling_ms`). A GEMM kernel (`GEMM_NAMES`, in step order: each layer's qkv, o,
  gate_up, down, then the LM head) reads its weight, the engine's own tensor; a kernel that
  reads the KV cache (`KV_NAMES`) its layer's share of the batch's K and V bytes, from the
  engine's pool of that layer; any other kernel (norms, SiLU·mul, quantization, the split
  reduction, argmax, the embedding's gather) reads a row of hidden states a sequence after its
  PDL wait. The weight and KV readers are benchmarks/read_ceiling.py's kernel, each kind on the
  tile that read fastest among read_ceiling's candidates, timed as the GEMMs' choice times them
  (`gemm_timing`'s chain: PDL on, each call after a kernel writing its input, the 32 layers'
  tensors in turn); its "ahead" tiles load their first tile before the PDL wait.
So `ceiling_ms` is what a step of these launches takes when every kernel does nothing but read
what it must: its fraction of the floor bounds any design that keeps one kernel an operation.
`reads_only_ms`: the same graph without the kernels that read no weight or KV (what fusing
every small operation into a reading kernel could at best give).
The engine's host work between graph replays and its input copies are in `step_ms` only."""
import argparse
import json
import re
import statistics
import time

import torch
import triton
import triton.language as tl

from benchmarks import pdl_chain, read_ceiling
from benchmarks.decode_step_timeline import PATCHES, engine_steps, patch_variants, replay_ms
from benchmarks.decode_throughput import (batch_state, copy_bandwidth, env_settings,
                                          graph_variants, kv_bytes_per_token, start_decodes,
                                          variant_order, weight_bytes_read)
from parashift import LLM
from parashift.kernels import gemm_timing, pdl
from parashift.worker import cuda_graphs

# kernels that read a weight (the engine's GEMVs and GEMMs, cuBLAS's and CUTLASS's)
GEMM_NAMES = re.compile(r"gemv|gemm|_skinny_kernel|_dense_tma_kernel|_fp8_tma|_gated_tma|_fp8_weight_"
                        r"|nvjet|xmma|cutlass", re.IGNORECASE)
KV_NAMES = ("preloaded_decode_kernel", "decode_attention_kernel", "paged_attention_kernel")
PROJECTIONS = ("qkv", "o", "gate_up", "down")
KV_ROW_BYTES = 4096  # the KV bytes a layer reads, viewed as rows of this many for the reader
# read_ceiling's candidates that were best or near it at some shape (its chain runs, session
# 45): the first tile before the PDL wait ("ahead") or not, 16-byte loads or TMA
CANDIDATES = tuple(c for c in read_ceiling.CANDIDATES if c[-1] in ("ahead", 1)
                   or c[0] == "tma" and c[1] >= 16 or c[:3] == ("regs", 16, 512))


def step_kernels(engine, steps: int = 2) -> list[dict]:
    """The kernels of one engine step in launch order (name, grid, µs), from a profile of
    `steps` steps (every step the same launches; copies and memsets left out)."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not kernels or len(kernels) % steps:
        raise RuntimeError(f"{len(kernels)} kernels in {steps} steps: not a whole step each")
    return [dict(name=e["name"], grid=e.get("args", {}).get("grid"), us=round(e["dur"], 2))
            for e in kernels[:len(kernels) // steps]]


def kind_of(name: str) -> str:
    if name.startswith(KV_NAMES):
        return "kv"
    return "gemm" if GEMM_NAMES.search(name) else "small"


def weights_in_step_order(model) -> list[tuple[str, torch.Tensor]]:
    """(projection, weight) as a Llama step reads them: each layer's four, then the LM head."""
    out = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        out += list(zip(PROJECTIONS, (attn.qkv_proj.weight, attn.o_proj.weight,
                                      mlp.gate_up_proj.weight, mlp.down_proj.weight)))
    return out + [("lm_head", model.lm_head.weight)]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D tensor's bytes, [rows, row bytes]."""
    if t.dim() != 2 or not t.is_contiguous():
        raise ValueError(f"a contiguous 2-D tensor expected, got {tuple(t.shape)} {t.stride()}")
    return t.view(torch.uint8)


def kv_views(model, kv_bytes_per_layer: int, readers_per_layer: int) -> list[torch.Tensor]:
    """Each KV reader's bytes: its share of its layer's K and V, from that layer's K pool."""
    share = kv_bytes_per_layer // readers_per_layer // KV_ROW_BYTES * KV_ROW_BYTES
    views = []
    for layer in model.model.layers:
        pool = layer.self_attn.attn.k_cache.view(-1).view(torch.uint8)
        if pool.numel() < share * readers_per_layer:
            raise ValueError(f"a layer's K pool holds {pool.numel()} bytes, "
                             f"{share * readers_per_layer} needed")
        views += [pool[i * share:(i + 1) * share].view(-1, KV_ROW_BYTES)
                  for i in range(readers_per_layer)]
    return views


def step_operations(kernels: list[dict], model, kv_bytes_per_layer: int) -> list[dict]:
    """Each kernel's operation: kind (a projection, "kv" or "small") and the bytes it reads
    (None for "small": a row of hidden states a sequence)."""
    kinds = [kind_of(k["name"]) for k in kernels]
    weights = weights_in_step_order(model)
    layers = len(model.model.layers)
    if kinds.count("gemm") != len(weights):
        gemms = [k["name"][:40] for k, kind in zip(kernels, kinds) if kind == "gemm"]
        raise ValueError(f"{len(gemms)} GEMM kernels in a step, {len(weights)} weights: {gemms}")
    if kinds.count("kv") % layers:
        raise ValueError(f"{kinds.count('kv')} KV-reading kernels for {layers} layers")
    gemms, kvs = iter(weights), iter(kv_views(model, kv_bytes_per_layer,
                                               kinds.count("kv") // layers))
    ops = []
    for kernel, kind in zip(kernels, kinds):
        if kind == "gemm":
            name, weight = next(gemms)
            ops.append(dict(kind=name, bytes=as_bytes(weight)))
        else:
            ops.append(dict(kind=kind, bytes=next(kvs) if kind == "kv" else None))
    return ops


@triton.jit
def _read_row_kernel(x_ptr, out_ptr, ROW: tl.constexpr, USE_PDL: tl.constexpr):
    """A small operation's least: after the PDL wait, a program reads its row of ROW bytes."""
    pdl.start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    values = tl.load(x_ptr + row * ROW + tl.arange(0, ROW))
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(values, axis=0))


def read_rows(rows: torch.Tensor, out: torch.Tensor) -> None:
    _read_row_kernel[(rows.shape[0],)](rows, out, ROW=rows.shape[1], num_warps=4,
                                       **pdl.launch_options(rows.device))


def fits(candidate: tuple, t: torch.Tensor) -> bool:
    return t.shape[1] % candidate[2] == 0 and (candidate[0] != "tma" or t.shape[0] >= candidate[1])


def best_tiles(ops: list[dict], out: torch.Tensor, row: torch.Tensor) -> dict:
    """Per kind of weight or KV read, read_ceiling's candidate that read its tensors fastest
    in the chain (each call after a kernel writing an input, PDL on), and its µs a call."""
    chosen = {}
    for kind in dict.fromkeys(op["kind"] for op in ops if op["bytes"] is not None):
        tensors = [op["bytes"] for op in ops if op["kind"] == kind]
        runs = {c: lambda i, c=c: read_ceiling.read(tensors[i], out, *c)
                for c in CANDIDATES if fits(c, tensors[0])}
        timings = gemm_timing.replayed_timings_ms(runs, len(tensors), (row, row.clone()))
        best = min(timings, key=timings.get)
        chosen[kind] = dict(config=best, us=round(1e3 * timings[best], 2),
                            mb=round(tensors[0].numel() / 1e6, 2), count=len(tensors),
                            candidates={" ".join(map(str, c)): round(1e3 * t, 2)
                                        for c, t in sorted(timings.items(), key=lambda kv: kv[1])})
    return chosen


def ceiling_ms(ops: list[dict], chosen: dict, rows: torch.Tensor, out: torch.Tensor,
               replays: int = 20, rounds: int = 7) -> float:
    """ms a replay of one CUDA graph of the step's read-only kernels (median of rounds)."""
    def step():
        for op in ops:
            if op["bytes"] is None:
                read_rows(rows, out)
            else:
                read_ceiling.read(op["bytes"], out, *chosen[op["kind"]]["config"])
    step()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    samples = []
    for _ in range(rounds):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / replays)
    return statistics.median(samples)


def by_kind(kernels: list[dict], ops: list[dict]) -> dict:
    """The engine's kernel µs a step summed by operation kind (durations overlap under PDL)."""
    sums = {}
    for kernel, op in zip(kernels, ops):
        kind = op["kind"] if op["kind"] != "small" else kernel["name"][:40]
        sums[kind] = round(sums.get(kind, 0.0) + kernel["us"], 2)
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def variant_steps(engine, graphs: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    """step_ms of each variant's decode graphs, rounds in turn (decode_throughput's order)."""
    step_ms = {name: [] for name in graphs}
    for _, name in variant_order(list(graphs), rounds):
        engine.runner.graphs = graphs[name]
        step_ms[name].append(engine_steps(engine, steps)["step_ms"])
    engine.runner.graphs = graphs["default"]
    return step_ms


def measure(llm: LLM, graphs: dict, batch: int, context: int, steps: int, rounds: int,
            bandwidth: float, profile_variants: list[str] = ()) -> dict:
    engine = llm.llm_engine
    runner = engine.runner
    model, cfg = runner.model, runner.model.config
    ids = start_decodes(engine, batch, context, cfg.vocab_size)
    before = batch_state(engine)
    variants = variant_steps(engine, graphs, steps, rounds)
    step_ms = variants.pop("default")
    graph_head = replay_ms(runner.graphs, batch, model, head=True)
    kernels = step_kernels(engine)
    profiled = {}
    for name in profile_variants:  # e.g. PARASHIFT_PDL=0: each kernel's own time
        runner.graphs = graphs[name]
        profiled[name] = step_kernels(engine)
    runner.graphs = graphs["default"]
    after = batch_state(engine)
    mean_context = (before["context_tokens"] + after["context_tokens"]) / 2 / batch
    kv_bytes = batch * mean_context * kv_bytes_per_token(cfg, runner.dtype.itemsize)
    floor = 1e3 * (weight_bytes_read(model, batch) + kv_bytes) / bandwidth
    row = dict(batch=batch, mean_context=round(mean_context, 1), floor_ms=round(floor, 4),
               step_ms=round(statistics.median(step_ms), 4), step_ms_rounds=step_ms,
               graph_head_ms=graph_head, kernels_per_step=len(kernels))
    row["engine_of_floor"] = round(floor / row["step_ms"], 4)
    row["variants"] = {name: dict(step_ms=round(statistics.median(v), 4), rounds=v,
                                  default_over_this=round(row["step_ms"] / statistics.median(v), 4))
                       for name, v in variants.items()}
    try:
        ops = step_operations(kernels, model, int(kv_bytes / cfg.num_hidden_layers))
        out = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        rows = torch.randint(0, 255, (batch, 2 * cfg.hidden_size), dtype=torch.uint8,
                             device="cuda")
        chosen = best_tiles(ops, out, torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16))
        ceiling = ceiling_ms(ops, chosen, rows, out)
        reads = ceiling_ms([op for op in ops if op["bytes"] is not None], chosen, rows, out)
        row.update(ceiling_ms=round(ceiling, 4), ceiling_of_floor=round(floor / ceiling, 4),
                   reads_only_ms=round(reads, 4), reads_only_of_floor=round(floor / reads, 4),
                   engine_over_ceiling=round(row["step_ms"] / ceiling, 4),
                   graph_head_over_ceiling=round(graph_head / ceiling, 4),
                   tiles={k: {**v, "config": " ".join(map(str, v["config"]))}
                          for k, v in chosen.items()},
                   engine_us_by_kind=by_kind(kernels, ops),
                   profiled={name: by_kind(k, ops) for name, k in profiled.items()})
    except Exception as exc:  # noqa: BLE001 - the engine's figures and kernels still reported
        row["ceiling_error"] = f"{type(exc).__name__}: {exc}"[:600]
    row["kernels"] = [(k["name"][:48], k["grid"], k["us"]) for k in kernels]
    row["profiled_kernels"] = {name: [(k["name"][:48], k["us"]) for k in ks]
                               for name, ks in profiled.items()}
    for rid in ids:
        engine.abort_request(rid)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--quantization", default=None, choices=[None, "fp8"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--graph-variants", nargs="+", default=[], type=env_settings,
                   help="NAME=VALUE[,NAME=VALUE]: the engine's step under decode graphs "
                   "captured with these settings too (decode_throughput.py's)")
    p.add_argument("--patch-variants", nargs="+", default=[], choices=sorted(PATCHES),
                   help="decode_step_timeline.py's: graphs captured with a module attribute "
                   "patched (launch settings no switch reads), measured as --graph-variants")
    p.add_argument("--profile-variants", nargs="+", default=[],
                   help="of --graph-variants: a step's kernels profiled under them too (e.g. "
                   "PARASHIFT_PDL=0: each kernel's own time, no overlap)")
    pdl_chain.add_no_dot_configs(p)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if not set(args.profile_variants) <= {*args.graph_variants, *args.patch_variants}:
        p.error(f"--profile-variants {args.profile_variants} are not all of --graph-variants")
    pdl_chain.apply_no_dot_configs(args)
    cuda_graphs.DEFAULT_BUCKETS = tuple(sorted(args.batch_sizes))
    start = time.perf_counter()
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.context + 1024,
              max_num_seqs=max(args.batch_sizes), skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=True, quantization=args.quantization,
              mixed_step_graphs=False)
    out = dict(model=args.model, quantization=args.quantization,
               device=torch.cuda.get_device_name(),
               start_up_s=round(time.perf_counter() - start, 1), rows=[])
    graphs = {**graph_variants(llm.llm_engine.runner, args.graph_variants),
              **patch_variants(llm.llm_engine.runner, args.patch_variants)}
    bandwidth = copy_bandwidth(llm.llm_engine.device)
    out["copy_bandwidth_tb_s"] = round(bandwidth / 1e12, 4)
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}), flush=True)
    for batch in args.batch_sizes:
        out["rows"].append(measure(llm, graphs, batch, args.context, args.decode_steps,
                                   args.rounds, bandwidth, args.profile_variants))
        print(json.dumps({k: v for k, v in out["rows"][-1].items()
                          if k not in ("kernels", "tiles", "profiled_kernels")}), flush=True)
        if args.output:
            with open(args.output, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
