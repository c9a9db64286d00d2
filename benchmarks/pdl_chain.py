"""Programmatic dependent launch (kernels/pdl.py) on the decode kernels of the 8B shape, on
one GPU: a step's 32 layers of the model's own kernels captured in a CUDA graph with PDL off
and with it on in each of `--variants` (PLACEMENT:KB: PARASHIFT_PDL early or late, the
GEMMs prefetching KB a program of their weights before the wait, 0: none), the graphs
replayed in turn (interleaved repeats), median µs per layer; the row's "on" is the first
variant's.

Usage (GPU): PYTHONPATH=. python3 benchmarks/pdl_chain.py [--batch-sizes 1 64]
    [--weights bf16 fp8] [--context 1024] [--layers 32] [--repeats 21]
    [--variants early:16 early:0 late:16 late:0] [--max-model-len N] [--output F]
A layer: add-RMSNorm, qkv, rotary writing K/V to the paged pool, paged attention over
`context` tokens a sequence (the three in one kernel where the engine's layer runs them so:
attention/rotate_attend.py), o, add-RMSNorm, gate_up, SiLU-and-mul, down; the projections
through `skinny_gemm.linear` (bf16) or `fp8_gemm.linear` (FP8, dynamic per-token scales)
as the engine calls them, their kernels chosen per shape on first use (timed with PDL off,
as in the engine; a row's `chosen` lists them: compare an engine run's, which chose anew).
Not here, beside the engine's step: the embedding, the final norm, the LM head (cuBLAS)
and sampling.
Every layer has weights and a KV pool of its own, so nothing stays in L2 from one layer to
the next. The floor: the layer's weight bytes (and weight + KV bytes) / 4.8 TB/s (the H200's
HBM) and / the measured copy bandwidth."""
import argparse
import json
import statistics
from dataclasses import dataclass

import torch

from benchmarks.decode_throughput import copy_bandwidth, environment
from parashift.attention.metadata import AttentionMetadata
from parashift.attention.rotate_attend import rotate_write_attend
from parashift.attention.triton_backend import TritonAttentionBackend
from parashift.kernels import fp8_gemm, pdl, rmsnorm, silu_mul, skinny_gemm
from parashift.quantization.fp8 import quantize_rows

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128
BLOCK_SIZE, EPS, HBM_TB_S = 16, 1e-5, 4.8
SHAPES = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM),
          "gate_up": (2 * INTERMEDIATE, HIDDEN), "down": (HIDDEN, INTERMEDIATE)}


@dataclass
class Layer:
    weights: dict  # name -> bf16 weight, or (E4M3 weight, fp32 scale [N, 1])
    norms: tuple[torch.Tensor, torch.Tensor]
    k_cache: torch.Tensor
    v_cache: torch.Tensor


def make_layers(count: int, fp8: bool, batch: int, context: int, device="cuda") -> list[Layer]:
    blocks = batch * -(-(context + 1) // BLOCK_SIZE)
    layers = []
    for _ in range(count):
        weights = {}
        for name, shape in SHAPES.items():
            w = torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02
            weights[name] = quantize_rows(w) if fp8 else w
        norms = tuple(1 + 0.1 * torch.randn(HIDDEN, device=device, dtype=torch.bfloat16)
                      for _ in range(2))
        pool = (blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        layers.append(Layer(weights, norms,
                            0.5 * torch.randn(pool, device=device, dtype=torch.bfloat16),
                            0.5 * torch.randn(pool, device=device, dtype=torch.bfloat16)))
    return layers


def step_args(count: int, fp8: bool, batch: int, context: int, max_model_len: int) -> tuple:
    """`step`'s positional arguments for `count` layers of their own: the hidden state and
    residual, the layers, their decode metadata, positions, cos/sin and the backend."""
    layers = make_layers(count, fp8, batch, context)
    meta = decode_metadata(batch, context, max_model_len)
    positions = torch.full((batch,), context, dtype=torch.int64, device="cuda")
    cos_sin = torch.randn(context + 1, HEAD_DIM, device="cuda")
    x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
    return (x, torch.randn_like(x), layers, meta, positions, cos_sin, TritonAttentionBackend())


def decode_metadata(batch: int, context: int, max_model_len: int,
                    device="cuda") -> AttentionMetadata:
    """Each sequence `context` tokens cached and one new, its blocks its own; the host's
    view as in the engine's captured graphs (`worker/cuda_graphs.py`): a static shape, every
    sequence max_model_len long (it sets the split-KV count)."""
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    tables = torch.arange(batch * per_seq, dtype=torch.int32, device=device).view(batch, -1)
    seq_lens = [context + 1] * batch
    slots = tables[:, context // BLOCK_SIZE].long() * BLOCK_SIZE + context % BLOCK_SIZE
    starts = list(range(batch + 1))
    return AttentionMetadata(
        slot_mapping=slots, query_start_loc=torch.tensor(starts, dtype=torch.int32,
                                                         device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables, query_start_loc_cpu=starts, seq_lens_cpu=[max_model_len] * batch,
        max_query_len=1, max_seq_len=max_model_len, block_size=BLOCK_SIZE, static_shape=True)


def linear(x: torch.Tensor, weight, x_fp8=None) -> torch.Tensor:
    if isinstance(weight, tuple):
        return fp8_gemm.linear(x, *weight, None, x_fp8)
    return skinny_gemm.linear(x, weight, None)


def norm(x, residual, weight, fp8_input: bool):
    """add-RMSNorm: (h, residual, h's rows quantized per token where fp8_input, else None)."""
    if fp8_input:
        h, residual, rows, scales = rmsnorm.rms_norm_fp8(x, residual, weight, EPS)
        return h, residual, (rows, scales)
    return *rmsnorm.add_rms_norm(x, residual, weight, EPS), None


def fp8_input_mlp(h: torch.Tensor, h_fp8, layer: Layer) -> torch.Tensor:
    """gate_up on the norm's quantized rows, SiLU-and-mul quantizing its own for down."""
    activated, rows, scales = silu_mul.silu_and_mul_fp8(
        linear(h, layer.weights["gate_up"], h_fp8))
    return linear(activated, layer.weights["down"], (rows, scales))


def mlp(h: torch.Tensor, layer: Layer) -> torch.Tensor:
    """gate_up, SiLU-and-mul, down."""
    return linear(silu_mul.silu_and_mul(linear(h, layer.weights["gate_up"])),
                  layer.weights["down"])


def step(x, residual, layers, meta, positions, cos_sin, backend, mlp=mlp, fp8_input=False):
    """The decode kernels of len(layers) layers (the MLP's by `mlp(h, layer)`); fp8_input:
    as the engine runs FP8 layers (layers/fp8_input.py), the norms and SiLU-and-mul hand
    the next GEMM their rows quantized (o's input quantized by its GEMM call)."""
    for layer in layers:
        h, residual, h_fp8 = norm(x, residual, layer.norms[0], fp8_input)
        x = attention(linear(h, layer.weights["qkv"], h_fp8), layer, meta, positions, cos_sin,
                      backend)
        h, residual, h_fp8 = norm(x, residual, layer.norms[1], fp8_input)
        x = fp8_input_mlp(h, h_fp8, layer) if fp8_input else mlp(h, layer)
    return x, residual


def attention(qkv, layer, meta, positions, cos_sin, backend) -> torch.Tensor:
    """Rotary (writing K/V to the layer's pool), paged attention and o of the qkv rows."""
    batch = qkv.shape[0]
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    o = rotate_write_attend(
        backend, positions, q.view(batch, HEADS, HEAD_DIM), k.view(batch, KV_HEADS, HEAD_DIM),
        v.view(batch, KV_HEADS, HEAD_DIM), cos_sin, layer.k_cache, layer.v_cache, meta,
        HEAD_DIM ** -0.5)
    return linear(o.view(batch, -1), layer.weights["o"])


def replayed_fractions(graphs: dict, layers, fp8: bool, batch: int, context: int, count: int,
                       bandwidth: float, repeats: int, alternate: bool = False
                       ) -> tuple[dict, int, int]:
    """Each variant's graph replayed `repeats` times in turn (alternate: every second round
    in the reverse order): ({variant: floor_fractions of its median time a layer}, a layer's
    weight bytes, the step's KV bytes a layer)."""
    samples = {name: [] for name in graphs}
    order = list(graphs)
    for r in range(repeats):
        for name in (order[::-1] if alternate and r % 2 else order):
            samples[name].append(replay_ms(graphs[name]))
    weight_bytes = sum(w[0].numel() if fp8 else 2 * w.numel() for w in
                       (layers[0].weights[name] for name in SHAPES))
    kv_bytes = 2 * batch * (context + 1) * KV_HEADS * HEAD_DIM * 2
    results = {name: floor_fractions(statistics.median(times) / 1e3 / count, weight_bytes,
                                     kv_bytes, bandwidth) for name, times in samples.items()}
    return results, weight_bytes, kv_bytes


def ratios_to_first(results: dict, first: str) -> None:
    """Adds `{first}_over_this` to each variant's row: first's time a layer over this one's."""
    base = results[first]["us_per_layer"]
    for row in results.values():
        row[f"{first}_over_this"] = round(base / row["us_per_layer"], 4)


def variant_graphs(variants: list[str], settings_of, run) -> tuple[dict, dict]:
    """A graph of `run(variant)` for each variant, captured with `settings_of(variant)` in the
    environment: ({variant: graph}, {variant: what run returned})."""
    graphs, outputs = {}, {}
    for name in variants:
        with environment(settings_of(name)):
            graphs[name] = capture(lambda: outputs.__setitem__(name, run(name)))
    return graphs, outputs


def largest_differences(outputs: dict, first: str) -> dict:
    """{variant: its output's largest |difference| from `first`'s}."""
    return {name: float((outputs[name].float() - outputs[first].float()).abs().max())
            for name in outputs}


def capture(run) -> torch.cuda.CUDAGraph:
    run()  # compiles this PDL setting's kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()  # uploads it
    torch.cuda.synchronize()
    return graph


def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def add_no_dot_configs(parser) -> None:
    parser.add_argument("--no-dot-configs", action="store_true",
                        help="leave fp8_gemm.py's tl.dot configs out of the FP8 GEMM choice "
                        "(never chosen above 4 rows since the TMA kernel, nor at one row): "
                        "less start-up time and compiles")


def apply_no_dot_configs(args) -> None:
    if args.no_dot_configs:
        fp8_gemm.CONFIGS = ()


def variant_parser(batch_sizes: list[int], repeats: int, weights: list[str] | None = None
                   ) -> argparse.ArgumentParser:
    """The options every variant script of these layers takes (`--weights` where `weights`,
    its default, is given); the script adds its `--variants`."""
    p = argparse.ArgumentParser()
    if weights is not None:
        p.add_argument("--weights", nargs="+", default=weights, choices=["fp8", "bf16"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=batch_sizes)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--repeats", type=int, default=repeats)
    add_no_dot_configs(p)
    p.add_argument("--output", default=None)
    return p


def run_rows(args, measure, weights: tuple[str, ...] = ("fp8",)) -> None:
    """`measure(weights, batch, bandwidth)`'s row for each weight dtype (args.weights where
    the script has them) and batch size, each reported as it comes."""
    apply_no_dot_configs(args)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    rows = []
    for dtype in getattr(args, "weights", weights):
        for batch in args.batch_sizes:
            rows.append(measure(dtype, batch, bandwidth))
            report(rows, bandwidth, args.output)


def report(rows: list[dict], bandwidth: float, output: str | None) -> None:
    """Prints the last row (without its GEMM choices and sweeps) and writes every row to
    `output` (after each: a run cut short keeps what it measured)."""
    print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("chosen", "sweep")}),
          flush=True)
    if output:
        with open(output, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(),
                           copy_bandwidth_tb_s=bandwidth / 1e12, rows=rows), f, indent=1)


def floor_fractions(layer_s: float, weight_bytes: int, kv_bytes: int, bandwidth: float
                    ) -> dict:
    return dict(us_per_layer=round(layer_s * 1e6, 2),
                weight_floor_fraction_4p8=round(weight_bytes / HBM_TB_S / 1e12 / layer_s, 4),
                floor_fraction_4p8=round((weight_bytes + kv_bytes) / HBM_TB_S / 1e12 / layer_s,
                                         4),
                floor_fraction_copy=round((weight_bytes + kv_bytes) / bandwidth / layer_s, 4))


def measure(weights: str, batch: int, context: int, count: int, repeats: int,
            bandwidth: float, variants: list[str], max_model_len: int) -> dict:
    """Graphs of the step with PDL off, then on in each variant (PLACEMENT:KB; the first
    is the row's "on"), replayed in turn."""
    fp8 = weights == "fp8"
    args = step_args(count, fp8, batch, context, max_model_len)
    layers = args[2]
    settings = {"off": ("0", pdl.DEFAULT_PREFETCH_KB)}
    settings.update({variant_name(v): tuple(v.split(":")) for v in variants})
    graphs, outputs = {}, {}
    for name, (flag, kb) in settings.items():  # off first: GEMM choices made without
        with pdl_env(flag, kb):
            graphs[name] = capture(lambda: outputs.__setitem__(name, step(*args)))
            pdl_on = pdl.pdl_enabled(torch.device("cuda"))
    same = all(torch.equal(a, b) for name in graphs
               for a, b in zip(outputs["off"], outputs[name]))
    results, weight_bytes, kv_bytes = replayed_fractions(graphs, layers, fp8, batch, context,
                                                         count, bandwidth, repeats)
    on = results[variant_name(variants[0])]
    row = dict(weights=weights, batch=batch, context=context, layers=count,
               pdl_enabled=pdl_on, same_bits=same, weight_mb=weight_bytes / 1e6,
               kv_mb=kv_bytes / 1e6, **{f"off_{k}": v for k, v in results["off"].items()},
               **{f"on_{k}": v for k, v in on.items()},
               speedup_on=round(results["off"]["us_per_layer"] / on["us_per_layer"], 4),
               variants=results,
               chosen=fp8_gemm.chosen() if fp8 else skinny_gemm.chosen())
    del graphs, layers
    torch.cuda.empty_cache()
    return row


def pdl_env(flag: str, kb: str):
    """PARASHIFT_PDL and PARASHIFT_PDL_PREFETCH_KB set within."""
    return environment({pdl.ENV: flag, pdl.PREFETCH_ENV: kb})


def variant_name(variant: str) -> str:
    """"late:16" -> "late_prefetch_16kb"."""
    placement, kb = variant.split(":")
    return f"{placement}_prefetch_{kb}kb"


def variant(text: str) -> str:
    placement, _, kb = text.partition(":")
    if placement not in ("early", "late") or not kb.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected PLACEMENT:KB, PLACEMENT early "
                                         "or late, KB a whole number (0: no prefetch)")
    return text


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--weights", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--variants", type=variant, nargs="+",
                   default=["early:16", "early:0", "late:16", "late:0"],
                   help="PDL variants, PLACEMENT:KB: PARASHIFT_PDL early or late, KB of its "
                        "weights a GEMM program prefetches before its wait (the first is the "
                        "row's 'on')")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: context + 1024, decode_throughput.py's (the engine's graphs "
                        "plan split-KV for it)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    rows = []
    for weights in args.weights:
        for batch in args.batch_sizes:
            rows.append(measure(weights, batch, args.context, args.layers, args.repeats,
                                bandwidth, args.variants,
                                args.max_model_len or args.context + 1024))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "chosen"}), flush=True)
    summary = dict(device=torch.cuda.get_device_name(), copy_bandwidth_tb_s=bandwidth / 1e12,
                   pdl_supported=all(r["pdl_enabled"] for r in rows), rows=rows)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
