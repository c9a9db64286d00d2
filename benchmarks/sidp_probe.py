"""SiDP's measure-first probe (issue 17): can a replica fetch the FFN weights it does not own
from its peers within a decode step?

Parts (`--parts`, each alone or together; the JSON at --out holds every measurement and
`b_th`, what the sidp policy reads: {"b_th": {"<model>|d=<d>|tp=<tp>": tokens per step}}):
- `step`: T(B), a decode step's seconds on one GPU at B sequences of --context tokens, for each
  model shape. A model that does not fit one GPU (the 70B) is cut to a few layers: the step is
  timed at two layer counts and extrapolated linearly to the model's (the difference is the
  per-layer cost; what does not scale with layers, LM head, sampling, host, stays once).
- `p2p` (two GPUs or more): peer read bandwidth with the copy engines (1-4 streams) and with an
  SM copy, incast (d-1 readers of one owner) against a rotated order (each reader its own
  owner), and a memory-bound GEMV's slowdown while a fetch runs.
B_th(model, d, TP) = the least B whose step time covers the fetch of (d-1)/d of the FFN
weights (per TP rank: / TP) at the peak read bandwidth (measured by `p2p`, else --p2p-gbps,
recorded as assumed). Under TP the step is taken as T(B)/TP (an estimate; a TP run needs the
GPUs). Usage:
    PYTHONPATH=. python3 benchmarks/sidp_probe.py --parts step p2p --out sidp.json
    PYTHONPATH=. python3 benchmarks/sidp_probe.py --smoke   # CPU: tiny shape, arithmetic only
"""
import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from decode_throughput import measure  # noqa: E402

BATCHES = [1, 8, 32, 64, 128, 256, 512, 1024]  # 2048 x 1024 tokens of 16 layers: no H200 holds
MODELS = ["benchmarks/shapes/qwen3-32b.json", "benchmarks/shapes/llama-3.1-70b.json"]


def ffn_bytes(cfg: dict, dtype_bytes: int = 2) -> int:
    """All layers' gate, up and down weights."""
    return cfg["num_hidden_layers"] * 3 * cfg["hidden_size"] * cfg["intermediate_size"] * dtype_bytes


def fetch_bytes(cfg: dict, d: int, tp: int) -> float:
    """What one rank of a SiDP group of d replicas (TP=tp each) fetches per decode step."""
    return (d - 1) / d * ffn_bytes(cfg) / tp


def b_threshold(step_s: dict[int, float], fetch: float, gbps: float, tp: int) -> int | None:
    """The least B whose step (T(B)/tp) covers the fetch at gbps, T linear between the
    batches measured; None if no batch measured does."""
    need = fetch / (gbps * 1e9)
    below = None
    for b in sorted(step_s):
        t = step_s[b] / tp
        if t >= need:
            if below is None:
                return b
            b0, t0 = below
            return math.ceil(b0 + (need - t0) / (t - t0) * (b - b0))
        below = (b, t)
    return None


def extrapolate(t_small: float, t_large: float, n_small: int, n_large: int, layers: int) -> float:
    per_layer = (t_large - t_small) / (n_large - n_small)
    return t_small + per_layer * (layers - n_small)


def cut_config(path: str, layers: int, tmp: str) -> str:
    with open(path) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = layers
    out = os.path.join(tmp, f"{os.path.basename(path).removesuffix('.json')}-{layers}.json")
    with open(out, "w") as f:  # a config file: random weights, as a shape is
        json.dump(cfg, f)
    return out


def step_times(model: str, layers: int, batches: list[int], context: int, steps: int,
               device: str, headroom: int) -> dict[int, float]:
    from parashift import LLM
    # room for every sequence to keep decoding while the last ones of a large batch prefill
    llm = LLM(model=model, dtype="bfloat16", max_model_len=context + headroom,
              max_num_seqs=max(batches), skip_tokenizer_init=True, enable_prefix_caching=False,
              device=device)
    vocab = llm.llm_engine.runner.model.config.vocab_size
    times = {}
    for b in batches:
        seconds, _, _ = measure(llm, b, context, steps, vocab) if device == "cuda" else \
            _cpu_measure(llm, b, context, steps, vocab)
        times[b] = seconds
        print(json.dumps({"model": model, "layers": layers, "batch": b, "step_ms": seconds * 1e3}),
              flush=True)
    llm.llm_engine.shutdown()
    del llm
    if device == "cuda":
        torch.cuda.empty_cache()
    return times


def _cpu_measure(llm, batch, context, steps, vocab):
    from decode_throughput import start_decodes
    engine = llm.llm_engine
    ids = start_decodes(engine, batch, context, vocab)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds = (time.perf_counter() - start) / steps
    for rid in ids:
        engine.abort_request(rid)
    return seconds, context, None


def run_step(args, tmp: str) -> dict:
    out = {}
    for model in args.models:
        with open(model) as f:
            cfg = json.load(f)
        small, large = args.layers
        t_small, t_large = (step_times(cut_config(model, n, tmp), n, args.batch_sizes,
                                       args.context, args.decode_steps, args.device,
                                       args.headroom) for n in (small, large))
        full = {b: extrapolate(t_small[b], t_large[b], small, large, cfg["num_hidden_layers"])
                for b in args.batch_sizes}
        out[model] = dict(layers_timed=[small, large], layers=cfg["num_hidden_layers"],
                          step_ms={b: full[b] * 1e3 for b in full}, ffn_gb=ffn_bytes(cfg) / 1e9)
    return out


def peer_copy_gbps(src: torch.Tensor, dst: torch.Tensor, streams: int, repeats: int = 5) -> float:
    chunks_src, chunks_dst = src.chunk(streams), dst.chunk(streams)
    pool = [torch.cuda.Stream(device=dst.device) for _ in range(streams)]
    torch.cuda.synchronize(dst.device)
    start = time.perf_counter()
    for _ in range(repeats):
        for s, a, b in zip(pool, chunks_src, chunks_dst):
            with torch.cuda.stream(s):
                b.copy_(a, non_blocking=True)
    torch.cuda.synchronize(dst.device)
    return src.numel() * src.element_size() * repeats / (time.perf_counter() - start) / 1e9


def sm_copy_gbps(src: torch.Tensor, dst: torch.Tensor, repeats: int = 5) -> float:
    """A kernel on dst's GPU reading src's memory (peer access) through the SMs instead of
    a copy engine (torch refuses cross-device operands, so a Triton copy of raw pointers)."""
    with torch.cuda.device(dst.device):
        _sm_copy(src, dst)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            _sm_copy(src, dst)
        torch.cuda.synchronize()
    return src.numel() * src.element_size() * repeats / (time.perf_counter() - start) / 1e9


def _sm_copy(src: torch.Tensor, dst: torch.Tensor, block: int = 8192) -> None:
    import triton
    grid = (triton.cdiv(src.numel(), block),)
    _copy_kernel()[grid](src, dst, src.numel(), BLOCK=block)


@functools.cache
def _copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + offsets, mask=offsets < n), mask=offsets < n)
    return copy


def run_p2p(args) -> dict:
    n = torch.cuda.device_count()
    if n < 2:
        print(json.dumps({"p2p": f"skipped: {n} GPU(s), needs 2 or more"}), flush=True)
        return {"skipped": f"{n} GPU(s)"}
    size = args.p2p_mib << 20
    bufs = [torch.empty(size // 2, dtype=torch.bfloat16, device=f"cuda:{i}") for i in range(n)]
    dsts = [torch.empty_like(b) for b in bufs]
    out = {"gpus": n, "bytes": size, "peer_access": torch.cuda.can_device_access_peer(0, 1)}
    out["copy_engine_gbps"] = {s: peer_copy_gbps(bufs[1], dsts[0], s) for s in (1, 2, 3, 4)}
    try:
        out["sm_copy_gbps"] = sm_copy_gbps(bufs[1], dsts[0])
    except Exception as exc:  # noqa: BLE001 - one part's failure must not lose the others
        out["sm_copy_gbps"] = f"failed: {type(exc).__name__}: {exc}"
    if n >= 3:  # incast: every other GPU reads GPU 0; rotated: reader i reads i+1
        out["incast_gbps_each"] = _concurrent(
            [(bufs[0], dsts[i]) for i in range(1, n)])
        out["rotated_gbps_each"] = _concurrent(
            [(bufs[(i + 1) % n], dsts[i]) for i in range(n)])
    out["gemv_slowdown_while_fetching"] = _gemv_slowdown(bufs[1], dsts[0])
    print(json.dumps({"p2p": out}), flush=True)
    return out


def _concurrent(pairs, repeats: int = 5) -> float:
    streams = [torch.cuda.Stream(device=d.device) for _, d in pairs]
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    start = time.perf_counter()
    for _ in range(repeats):
        for s, (src, dst) in zip(streams, pairs):
            with torch.cuda.stream(s):
                dst.copy_(src, non_blocking=True)
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    seconds = time.perf_counter() - start
    return pairs[0][0].numel() * 2 * repeats / seconds / 1e9


def _gemv_slowdown(peer: torch.Tensor, local: torch.Tensor) -> float:
    """A [1, 8192] x [8192, 28672] GEMV's time while a peer fetch runs ÷ alone."""
    with torch.cuda.device(local.device):
        w = torch.randn(28672, 8192, dtype=torch.bfloat16, device=local.device)
        x = torch.randn(1, 8192, dtype=torch.bfloat16, device=local.device)

        def gemv_ms(fetch: bool) -> float:
            copier = torch.cuda.Stream()
            torch.cuda.synchronize()
            if fetch:
                with torch.cuda.stream(copier):
                    for _ in range(4):
                        local.copy_(peer, non_blocking=True)
            start = time.perf_counter()
            for _ in range(20):
                torch.nn.functional.linear(x, w)
            torch.cuda.current_stream().synchronize()
            elapsed = time.perf_counter() - start
            torch.cuda.synchronize()
            return elapsed
        gemv_ms(False)
        return gemv_ms(True) / gemv_ms(False)


def thresholds(steps: dict, gbps: float, assumed: bool) -> dict:
    b_th = {}
    for model, row in steps.items():
        with open(model) as f:
            cfg = json.load(f)
        name = os.path.basename(model).removesuffix(".json")
        step_s = {int(b): ms / 1e3 for b, ms in row["step_ms"].items()}
        for d in (2, 4):
            for tp in (1, 2):
                b_th[f"{name}|d={d}|tp={tp}"] = b_threshold(step_s, fetch_bytes(cfg, d, tp),
                                                            gbps, tp)
    return dict(b_th=b_th, p2p_gbps=gbps, p2p_gbps_assumed=assumed)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", choices=["step", "p2p"], default=["step", "p2p"])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=BATCHES)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--layers", type=int, nargs=2, default=[8, 16],
                   help="the two layer counts timed and extrapolated from: enough that the "
                        "device, not the host, sets the step (async scheduling overlaps them, "
                        "so a host-bound step does not add up per layer)")
    p.add_argument("--headroom", type=int, default=4096,
                   help="tokens a sequence may generate beyond --context (the timed steps "
                        "need every sequence still running after a large batch's prefill)")
    p.add_argument("--p2p-gbps", type=float, default=224.0,
                   help="read bandwidth when `p2p` is not run (../shared/workloads.md: a "
                        "GPU-to-GPU copy on 2 H200s)")
    p.add_argument("--p2p-mib", type=int, default=1024)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, few batches")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.smoke:
        args.device, args.parts = "cpu", ["step"]
        args.models, args.batch_sizes = ["benchmarks/shapes/tiny-llama.json"], [1, 4]
        args.context, args.decode_steps, args.layers, args.headroom = 32, 2, [1, 2], 64
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "context": args.context}
    with tempfile.TemporaryDirectory() as tmp:
        if "step" in args.parts:
            result["step"] = run_step(args, tmp)
    if "p2p" in args.parts:
        result["p2p"] = run_p2p(args)
    peak = max(result.get("p2p", {}).get("copy_engine_gbps", {}).values(), default=None)
    if "step" in result:
        result.update(thresholds(result["step"], peak or args.p2p_gbps, peak is None))
    print(json.dumps({k: v for k, v in result.items() if k != "step"}, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
