"""One engine, one model, the prefill step timed under switches that are read at each launch,
so that their effect shows without another start-up (~50 s for Qwen3-30B-A3B): PDL off
(PARASHIFT_PDL=0), the MoE prefill path off (PARASHIFT_MOE_PREFILL=0), the sweep's tiles
(PARASHIFT_MOE_PREFILL_TILES=--tiles), cuDNN's prefill attention off (the Triton kernel).
Each variant's row: the step as prefill_throughput.py times it and, of its model forward, the
host's time to issue it (perf_counter around the call, no sync) against the device's span
(CUDA events around it); the issue time near the step time means launches (or a host sync
in the forward) set the pace. Also the caching allocator's retries and device frees in the
timed runs (each a device sync). Runs with any tree's parashift first on PYTHONPATH (a
switch that tree lacks changes nothing there).

Usage (GPU): python3 benchmarks/prefill_variants.py --model benchmarks/shapes/qwen3-30b-a3b.json \
    --prompt-lens 512 4096 --variants default pdl_off moe_prefill_off cudnn_off \
    [--tiles tiles.json] [--tile-files name=tiles.json ...] [--profile] [--python-profile]
    [--output variants.json]"""
import argparse
import contextlib
import cProfile
import json
import os
import pstats
import random
import statistics
import time

import torch

from prefill_throughput import (BF16_MATRIX_RATE, prefill_flops, profile_prefill, time_prefill,
                                write_rows)

from parashift import LLM, SamplingParams

PROFILE_TOP = 40  # kernels of the profiled step kept, longest first
VARIANTS = {"default": {}, "pdl_off": {"PARASHIFT_PDL": "0"},
            "moe_prefill_off": {"PARASHIFT_MOE_PREFILL": "0"}, "swept_tiles": None,
            "cudnn_off": {}}


@contextlib.contextmanager
def variant(name: str, runner, tiles: str | None, tile_files: dict | None = None):
    env = dict(VARIANTS.get(name) or {})
    if name == "swept_tiles":
        env = {"PARASHIFT_MOE_PREFILL_TILES": tiles}
    if name in (tile_files or {}):  # --tile-files: a tiles file of its own
        env = {"PARASHIFT_MOE_PREFILL_TILES": tile_files[name]}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    backend = runner.backend
    thresholds = {key: getattr(backend, key) for key in ("long_prefill_tokens", "chunk_tokens")
                  if hasattr(backend, key)}
    if name == "cudnn_off" or name.endswith("_cudnn_off"):  # a tiles file's too
        for key in thresholds:
            setattr(backend, key, 1 << 30)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for key, value in thresholds.items():
            setattr(backend, key, value)


class ForwardTimes:
    """The model forward's host issue time and device span, per call."""

    def __init__(self, model):
        self.host_ms, self.device_ms, self._events = [], [], []
        self.python_profile = None  # {} asks for the next call's cProfile summary
        self._forward = model.forward
        model.forward = self

    def __call__(self, *args, **kwargs):
        if self.python_profile is not None:  # this call under cProfile, not timed
            profiler = cProfile.Profile()
            out = profiler.runcall(self._forward, *args, **kwargs)
            self.python_profile = python_functions(profiler)
            return out
        cuda = torch.cuda.is_available()  # on the CPU (a smoke run) the host's time twice
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2)) if cuda else (0, 0)
        if cuda:
            start.record()
        t0 = time.perf_counter()
        out = self._forward(*args, **kwargs)
        self.host_ms.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            end.record()
        self._events.append((start, end) if cuda else self.host_ms[-1])
        return out

    def take(self) -> tuple[float | None, float | None]:
        """Medians of the calls since the last take but the first (time_prefill's warm-up),
        the device's after a sync; None where every step replayed a CUDA graph."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            device = [s.elapsed_time(e) for s, e in self._events][1:]
        else:
            device = self._events[1:]
        host, self.host_ms, self._events = self.host_ms[1:], [], []
        if not host:
            return None, None
        return round(statistics.median(host), 3), round(statistics.median(device), 3)


def python_functions(profiler, top: int = 20) -> list[tuple[str, float, int]]:
    """The forward's Python functions by their own time, most first: (where, ms, calls)
    (cProfile slows Python: the ranking, not the times, is the point)."""
    stats = pstats.Stats(profiler).stats
    rows = sorted(((f"{os.path.basename(file)}:{line}({name})", own * 1e3, calls)
                   for (file, line, name), (_, calls, own, _, _) in stats.items()),
                  key=lambda row: -row[1])
    return [(where, round(ms, 3), calls) for where, ms, calls in rows[:top]]


def one_prompt(llm, length: int, vocab: int) -> None:
    engine, rng = llm.llm_engine, random.Random(length + 1)
    engine.add_request(f"python-profile{length}", [rng.randrange(vocab) for _ in range(length)],
                       SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def allocator_counts() -> dict:
    stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    return {key: stats.get(key, 0) for key in ("num_alloc_retries", "num_device_free",
                                               "num_device_alloc")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/qwen3-30b-a3b.json")
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--variants", nargs="+", default=["default", "pdl_off"],
                   choices=sorted(VARIANTS))
    p.add_argument("--variant-lens", type=int, nargs="+", default=None,
                   help="the lengths the variants past the first run at (default: the longest)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiles", default=None, help="benchmarks/moe_prefill.py's --tiles-out")
    p.add_argument("--tile-files", nargs="*", default=[], metavar="NAME=PATH",
                   help="more variants: each runs with PARASHIFT_MOE_PREFILL_TILES=PATH "
                        "(a NAME ending in _cudnn_off also without cuDNN's prefill route)")
    p.add_argument("--profile", action="store_true", help="the first variant's longest prompt")
    p.add_argument("--python-profile", action="store_true",
                   help="the first variant's longest prompt's forward under cProfile")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    tile_files = dict(item.split("=", 1) for item in args.tile_files)
    longest = max(args.prompt_lens)
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=longest + 16,
              max_num_batched_tokens=longest, long_prefill_token_threshold=0,
              skip_tokenizer_init=True, enable_prefix_caching=False, cuda_graphs=None,
              mixed_step_graphs=True)  # as prefill_throughput.py's defaults
    runner = llm.llm_engine.runner
    vocab = runner.model.config.vocab_size
    forward = ForwardTimes(runner.model)
    rows = []
    for i, name in enumerate(args.variants + list(tile_files)):
        if name == "swept_tiles" and not (args.tiles and os.path.exists(args.tiles)):
            print(f"{name}: no tiles file {args.tiles!r}, skipped", flush=True)
            continue
        lens = args.prompt_lens if i == 0 else (args.variant_lens or [longest])
        for length in lens:
            with variant(name, runner, args.tiles, tile_files):
                forward.take()
                before = allocator_counts()
                seconds = time_prefill(llm, length, vocab, args.repeats)
                host_ms, device_ms = forward.take()
                after = allocator_counts()
                floor = prefill_flops(runner.model, length) / BF16_MATRIX_RATE
                row = dict(variant=name, prompt_len=length, step_ms=round(seconds * 1e3, 3),
                           floor_ms=round(floor * 1e3, 3),
                           fraction_of_floor=round(floor / seconds, 3),
                           forward_host_ms=host_ms, forward_device_ms=device_ms,
                           allocator=dict((k, after[k] - before[k]) for k in after))
                if args.profile and i == 0 and length == longest:
                    row["profile"] = profile_prefill(llm, length, vocab, top=PROFILE_TOP)
                    forward.take()
                if args.python_profile and i == 0 and length == longest:
                    forward.python_profile = {}
                    one_prompt(llm, length, vocab)
                    row["python_profile"], forward.python_profile = forward.python_profile, None
            print(json.dumps(row), flush=True)
            rows.append(row)
    llm.llm_engine.shutdown()
    if args.output:
        write_rows(args.output, args.model, rows)


if __name__ == "__main__":
    main()
