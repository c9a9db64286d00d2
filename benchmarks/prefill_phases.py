"""Where a prefill step's time goes beside its kernels (issues 60 and 61): the host's
phases and the device's timeline of one long prompt's step, from add_request to its token.

Usage: python3 benchmarks/prefill_phases.py --model benchmarks/shapes/llama-3.1-8b.json \
    --prompt-len 4096 [--quantization fp8] [--repeats 5] [--trace-dir DIR] [--cprofile]
    [--variants base PARASHIFT_PDL=0 PARASHIFT_FP8_FUSED_INPUT=1] [--output F]

Per timed prompt (the first warms up; medians reported): the host's milliseconds in each
part of `host_overhead.PARTS` (nested: `launch` holds `step_inputs`, `model_forward`, ..),
and a timeline in milliseconds from the moment the prompt is added, with the device idle
then: `host_*` when the host reached a point (perf_counter), `device_*` when the device
did (a CUDA event recorded there, timed from one recorded at the start). `device_layer_ms`:
each decoder layer's device time; `layer_waits_for_host`: the layers whose start event ran
within 20 us of the host recording it (the device had nothing queued: it waited for the
launches). On the CPU the device columns are absent. With --trace-dir one more prompt runs
under torch.profiler (CPU and CUDA activities): its Chrome trace (gzip) and, from it, the
first kernel's start, the device's idle time and the longest gaps between kernels. With
--cprofile one more prompt runs under cProfile: the functions with the most own time. With
--variants each variant's step is timed in rounds of one prompt per variant (interleaved, a
first round warming up; medians): `base`, or settings `KEY=VALUE` joined by `+`, each an
environment variable read at run time (PARASHIFT_PDL) or PARASHIFT_FP8_FUSED_INPUT (read at
the model's construction: the producers of each FP8 layer's input are swapped in place)."""
import argparse
import collections
import contextlib
import gzip
import json
import os
import random
import shutil
import statistics
import time

import torch

from host_overhead import timed_parts
from parashift import LLM, SamplingParams
from parashift.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from parashift.worker import model_runner

WAIT_US = 20  # a layer's start event this close to its recording: the device was waiting


class Timeline:
    """Host times and device events at named points of one prompt's step."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.host, self.events, self.layers = {}, {}, []
        if cuda:
            torch.cuda.synchronize()
        self.start_host = time.perf_counter()
        if cuda:
            self.start_event = self._event()

    @staticmethod
    def _event() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, name: str) -> None:
        if name not in self.host:  # the first time a point is reached
            self.host[name] = time.perf_counter()
            if self.cuda:
                self.events[name] = self._event()

    def mark_layer(self) -> None:
        self.layers.append((time.perf_counter(), self._event() if self.cuda else None))

    def result(self, end_host: float) -> dict:
        ms = lambda t: (t - self.start_host) * 1e3  # noqa: E731
        row = {"total_ms": ms(end_host)}
        row.update({f"host_{name}": ms(t) for name, t in self.host.items()})
        if self.cuda:
            torch.cuda.synchronize()
            since = self.start_event.elapsed_time
            row.update({f"device_{name}": since(e) for name, e in self.events.items()})
            starts = [since(e) for _, e in self.layers]
            row["device_layer_ms"] = [round(b - a, 4) for a, b in zip(starts, starts[1:])]
            row["layer_waits_for_host"] = [
                i for i, ((host, _), device) in enumerate(zip(self.layers, starts))
                if device - ms(host) < WAIT_US / 1e3]
            row["layer_host_ahead_ms"] = [round(device - ms(host), 3)
                                          for (host, _), device in zip(self.layers, starts)]
            row["layers_waiting"] = len(row["layer_waits_for_host"])
            row["host_ahead_min_ms"] = min(row["layer_host_ahead_ms"], default=0.0)
        return row


@contextlib.contextmanager
def marked(timeline_of):
    """Marks, on the timeline `timeline_of()` returns: the model's forward called and
    returned, the logits made, the wait for the sampled token started and ended, and each
    decoder layer's start."""
    patches = [(LlamaForCausalLM, "forward", "forward"),
               (LlamaForCausalLM, "compute_logits", "logits"),
               (model_runner.PendingStep, "result", "wait")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, label in patches:
        def wrapped(*args, _original=getattr(owner, name), _label=label, **kwargs):
            timeline_of().mark(f"{_label}_called")
            try:
                return _original(*args, **kwargs)
            finally:
                timeline_of().mark(f"{_label}_returned")
        setattr(owner, name, wrapped)
    layer_forward = LlamaDecoderLayer.forward

    def layer(*args, **kwargs):
        timeline_of().mark_layer()
        return layer_forward(*args, **kwargs)
    LlamaDecoderLayer.forward = layer
    originals.append((LlamaDecoderLayer, "forward", layer_forward))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def run_prompt(engine, request_id: str, prompt: list[int]) -> None:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.add_request(request_id, prompt, params)
    while engine.has_unfinished_requests():
        engine.step()


def timed_prompts(llm: LLM, length: int, vocab: int, repeats: int, cuda: bool) -> list[dict]:
    rng, rows, current = random.Random(length), [], [None]
    with marked(lambda: current[0]):
        for i in range(repeats + 1):
            prompt = [rng.randrange(vocab) for _ in range(length)]
            current[0] = Timeline(cuda)
            with timed_parts() as seconds:
                run_prompt(llm.llm_engine, f"p{i}", prompt)
            end = time.perf_counter()
            row = current[0].result(end)
            row["host_parts_ms"] = {k: round(v * 1e3, 3) for k, v in seconds.most_common()}
            rows.append(row)
    return rows[1:]  # the first warms up


def medians(rows: list[dict]) -> dict:
    out = {}
    for key, value in rows[0].items():
        if isinstance(value, (int, float)):
            out[key] = round(statistics.median(r[key] for r in rows), 3)
    parts = collections.defaultdict(list)
    for r in rows:
        for part, ms in r["host_parts_ms"].items():
            parts[part].append(ms)
    out["host_parts_ms"] = {part: round(statistics.median(v), 3) for part, v in parts.items()}
    if "device_forward_called" in out:  # the device idle until the forward's first kernel
        out["forward_device_span_ms"] = round(
            out["device_forward_returned"] - out["device_forward_called"], 3)
        out["after_logits_ms"] = round(out["total_ms"] - out["device_logits_returned"], 3)
    return out


def profiled_prompt(llm: LLM, length: int, vocab: int, trace_dir: str) -> dict:
    """One more prompt under torch.profiler: its trace (gzip) and the device's gaps."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    rng = random.Random(-length)
    prompt = [rng.randrange(vocab) for _ in range(length)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available()
                                           else [])
    with profile(activities=activities) as prof:
        with record_function("prefill_prompt"):
            run_prompt(llm.llm_engine, "profiled", prompt)
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, "prefill.trace.json")
    prof.export_chrome_trace(path)
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    events = prof.events()
    host = [e for e in events if e.device_type == DeviceType.CPU]
    kernels = sorted((e for e in events if e.device_type != DeviceType.CPU  # not the
                      and e.name != "prefill_prompt"),  # annotation's span on the device
                     key=lambda e: e.time_range.start)
    start = min(e.time_range.start for e in host)
    span_ms = (max(e.time_range.end for e in events) - start) / 1e3
    summary = {"trace": path + ".gz", "span_ms": span_ms}
    if kernels:
        gaps, end, last = [], kernels[0].time_range.end, kernels[0]
        for kernel in kernels[1:]:
            if kernel.time_range.start > end:
                gaps.append(((kernel.time_range.start - end) / 1e3, last.name, kernel.name))
            if kernel.time_range.end > end:
                end, last = kernel.time_range.end, kernel
        summary.update(first_kernel_ms=(kernels[0].time_range.start - start) / 1e3,
                       last_kernel_end_ms=(end - start) / 1e3,
                       device_gaps_ms=round(sum(g for g, _, _ in gaps), 3),
                       gaps_over_50us=sum(1 for g, _, _ in gaps if g > 0.05),
                       longest_gaps=[(round(g, 3), a[:60], b[:60])
                                     for g, a, b in sorted(gaps, reverse=True)[:15]])
    return summary


def cprofiled_prompt(llm: LLM, length: int, vocab: int, top: int = 40) -> list:
    """One more prompt under cProfile (Python's own time per function, the host's share)."""
    import cProfile
    from host_overhead import top_functions
    rng = random.Random(-2 * length)
    prompt = [rng.randrange(vocab) for _ in range(length)]
    profiler = cProfile.Profile()
    profiler.enable()
    run_prompt(llm.llm_engine, "cprofiled", prompt)
    profiler.disable()
    return top_functions(profiler, top)


def set_fused_inputs(model, mode: str, plain: dict) -> None:
    """The model's plain producers of FP8 inputs (recorded in `plain` the first time), then
    the quantizing twins PARASHIFT_FP8_FUSED_INPUT=mode names."""
    from parashift.layers import fp8_input
    for module in model.modules():
        for producer_name, _ in getattr(module, "fp8_input_pairs", ()):
            key = (id(module), producer_name)
            plain.setdefault(key, getattr(module, producer_name))
            setattr(module, producer_name, plain[key])
    previous = os.environ.get("PARASHIFT_FP8_FUSED_INPUT")
    os.environ["PARASHIFT_FP8_FUSED_INPUT"] = mode
    try:
        fp8_input.hand_over_fp8_inputs(model)
    finally:
        if previous is None:
            del os.environ["PARASHIFT_FP8_FUSED_INPUT"]
        else:
            os.environ["PARASHIFT_FP8_FUSED_INPUT"] = previous


def apply_variant(model, variant: str, plain: dict) -> dict:
    """Sets a variant's environment (returns what to restore) and its FP8 input producers."""
    settings = dict(item.split("=", 1) for item in variant.split("+") if item != "base")
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    set_fused_inputs(model, settings.get("PARASHIFT_FP8_FUSED_INPUT", "0"), plain)
    return saved


def restore(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def variant_ab(llm: LLM, length: int, vocab: int, variants: list[str], rounds: int) -> dict:
    """Median ms of one prompt's step per variant, the variants interleaved round by round."""
    model, plain, times = llm.llm_engine.runner.model, {}, collections.defaultdict(list)
    rng = random.Random(-3 * length)
    for i in range(rounds + 1):
        for variant in variants:
            saved = apply_variant(model, variant, plain)
            prompt = [rng.randrange(vocab) for _ in range(length)]
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            run_prompt(llm.llm_engine, f"ab{i}-{variant}", prompt)
            if i:  # the first round warms up (each variant's kernels compiled)
                times[variant].append((time.perf_counter() - start) * 1e3)
            restore(saved)
    set_fused_inputs(model, "0", plain)
    return {variant: dict(median_ms=round(statistics.median(t), 3), ms=[round(v, 3) for v in t])
            for variant, t in times.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--prompt-len", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quantization", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=False,
                   help="off by default: a long prompt's step runs eagerly either way, and "
                        "start-up captures none")
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--variants", nargs="+", default=None)
    p.add_argument("--ab-rounds", type=int, default=5)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    from parashift.loader.source import load_hf_config, resolve_model
    llm = LLM(model=args.model, dtype=args.dtype, device=args.device,
              max_model_len=args.prompt_len + 16, max_num_batched_tokens=args.prompt_len,
              long_prefill_token_threshold=0, skip_tokenizer_init=True,
              quantization=args.quantization, enable_prefix_caching=False,
              cuda_graphs=args.cuda_graphs)
    vocab = load_hf_config(resolve_model(args.model)).vocab_size
    cuda = llm.llm_engine.runner.device.type == "cuda"
    rows = timed_prompts(llm, args.prompt_len, vocab, args.repeats, cuda)
    result = dict(model=args.model, quantization=args.quantization, prompt_len=args.prompt_len,
                  median=medians(rows), rows=rows)
    print(json.dumps(result["median"]), flush=True)
    if args.trace_dir:
        result["profile"] = profiled_prompt(llm, args.prompt_len, vocab, args.trace_dir)
        print(json.dumps(result["profile"]), flush=True)
    if args.cprofile:
        result["cprofile"] = cprofiled_prompt(llm, args.prompt_len, vocab)
        print(json.dumps(result["cprofile"][:25]), flush=True)
    if args.variants:
        result["variants"] = variant_ab(llm, args.prompt_len, vocab, args.variants,
                                        args.ab_rounds)
        print(json.dumps(result["variants"]), flush=True)
    llm.llm_engine.shutdown()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
