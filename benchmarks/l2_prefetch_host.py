"""The host time of an eager prefill step with the L2 prefetch's points (the decoder blocks'
calls after their GEMMs, layers/l2_prefetch.py) against forward hooks doing what the hooks
before them did at each call (the switch read from the environment, the output's rows
checked; every hooked GEMM on torch's full module call path), and against neither (issue 61).

Usage (GPU): PYTHONPATH=. python3 benchmarks/l2_prefetch_host.py
    [--model benchmarks/shapes/llama-3.1-8b.json] [--prompt-len 512] [--rounds 4]
    [--repeats 5] [--quantization fp8] [--output F]
    (any host: --per-call: µs each way adds to one module's call at prefill rows, no engine)
One engine without CUDA graphs; each way (`calls`, `hooks`, `none`) in turn, --rounds times
(the order reversed every other round), --repeats prompts of --prompt-len tokens each
(max_tokens 1: one prefill step); per way the median host ms of the model's forward (its
kernels launched, not waited for: the host's share of the step) and of the whole request."""
import argparse
import json
import random
import statistics
import time

import torch

from parashift import LLM, SamplingParams
from parashift.kernels import use_triton
from parashift.layers import l2_prefetch

WAYS = ("calls", "hooks", "none")


def hook_body(steps, index: int):
    """A forward hook doing what the removed hooks did at each call."""
    def after_gemm(module, args, output):
        if (l2_prefetch.enabled(steps.default) and isinstance(output, torch.Tensor)
                and use_triton(output)
                and output.numel() // output.shape[-1] <= l2_prefetch.MAX_ROWS):
            steps.launch(index, l2_prefetch.budget_text())
    return after_gemm


class Ways:
    """Puts the model's blocks in one way at a time: their points (as built), forward hooks
    on their GEMMs instead, or neither."""

    def __init__(self, model: torch.nn.Module):
        self.gemms = l2_prefetch.step_gemms(model)
        self.points = {block: block.l2_prefetch for _, block, _ in self.gemms}
        steps = {id(p.steps): p.steps for p in self.points.values()
                 if isinstance(p, l2_prefetch.BlockPrefetches)}
        if len(steps) != 1:
            raise RuntimeError("the model has no L2 prefetch points (PARASHIFT_L2_PREFETCH=0?)")
        self.steps = next(iter(steps.values()))
        self.handles = []

    def use(self, way: str) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for block, points in self.points.items():
            block.l2_prefetch = points if way == "calls" else l2_prefetch.NO_PREFETCHES
        if way == "hooks":
            self.handles = [layer.register_forward_hook(hook_body(self.steps, index))
                            for index, (_, _, layer) in enumerate(self.gemms)]


def prefill_ms(llm: LLM, model: torch.nn.Module, length: int, vocab: int, repeats: int,
               rng: random.Random) -> tuple[list[float], list[float]]:
    """(host ms of each prompt's forward, ms of each whole request) over `repeats` prompts."""
    engine, params = llm.llm_engine, SamplingParams(temperature=0, max_tokens=1,
                                                    ignore_eos=True)
    plain, forwards, requests, tokens = model.forward, [], [], []

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return plain(*args, **kwargs)
        finally:
            forwards.append(1e3 * (time.perf_counter() - start))
            tokens.append((args[0] if args else kwargs["token_ids"]).shape[0])
    model.forward = timed
    try:
        for i in range(repeats):
            start = time.perf_counter()
            engine.add_request(f"p{rng.random()}", [rng.randrange(vocab) for _ in range(length)],
                               params)
            while engine.has_unfinished_requests():
                engine.step()
            requests.append(1e3 * (time.perf_counter() - start))
    finally:
        del model.forward
    if set(tokens) != {length}:
        raise RuntimeError(f"expected one forward of {length} tokens a prompt, got {tokens}")
    return forwards, requests


def per_call_us(rows: int = 512, calls: int = 20_000, best_of: int = 5) -> dict:
    """µs a call of an identity module (a GEMM's stand-in) at `rows` rows adds with a point
    called after it and with the hook instead: the best of `best_of` loops of `calls`."""
    class Steps:  # nothing launches at prefill rows either way
        default = l2_prefetch.DEFAULT_MODE

        def after(self, index, output):
            pass
    module, x, steps = torch.nn.Identity(), torch.zeros(rows, 8), Steps()
    points = l2_prefetch.BlockPrefetches(steps, {"qkv": 0})

    def best(run) -> float:
        times = []
        for _ in range(best_of):
            start = time.perf_counter()
            for _ in range(calls):
                run()
            times.append((time.perf_counter() - start) / calls * 1e6)
        return min(times)
    plain = best(lambda: module(x))
    called = best(lambda: points.after("qkv", module(x)))
    module.register_forward_hook(hook_body(steps, 0))
    hooked = best(lambda: module(x))
    return dict(rows=rows, plain_us=round(plain, 3), call_adds_us=round(called - plain, 3),
                hook_adds_us=round(hooked - plain, 3))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quantization", default=None)
    p.add_argument("--output", default=None)
    p.add_argument("--per-call", action="store_true")
    args = p.parse_args()
    if args.per_call:
        print(json.dumps(per_call_us(args.prompt_len)))
        return
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.prompt_len + 16,
              max_num_batched_tokens=args.prompt_len, long_prefill_token_threshold=0,
              skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=False, quantization=args.quantization)
    model = llm.llm_engine.runner.model
    ways, rng = Ways(model), random.Random(0)
    vocab = model.config.vocab_size
    samples = {way: ([], []) for way in WAYS}
    for way in WAYS:  # warm-up: each way's first prompts compile and choose
        ways.use(way)
        prefill_ms(llm, model, args.prompt_len, vocab, 2, rng)
    for round_ in range(args.rounds):
        for way in (WAYS if round_ % 2 == 0 else WAYS[::-1]):
            ways.use(way)
            forwards, requests = prefill_ms(llm, model, args.prompt_len, vocab, args.repeats,
                                            rng)
            samples[way][0].extend(forwards)
            samples[way][1].extend(requests)
    ways.use("calls")
    rows = [dict(way=way, forward_host_ms=round(statistics.median(f), 4),
                 forward_host_ms_mean=round(statistics.mean(f), 4),
                 forward_host_ms_min=round(min(f), 4), request_ms=round(statistics.median(r), 4),
                 samples=len(f)) for way, (f, r) in samples.items()]
    for row in rows:
        row["forward_minus_none_ms"] = round(row["forward_host_ms"] - rows[-1]["forward_host_ms"],
                                             4)
        print(json.dumps(row), flush=True)
    llm.llm_engine.shutdown()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(model=args.model, prompt_len=args.prompt_len,
                           quantization=args.quantization, gemms=len(ways.gemms), rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
