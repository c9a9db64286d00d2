"""Prefill of one long prompt in one step, beside the bf16 matrix-rate floor.

Usage (GPU): python3 benchmarks/prefill_throughput.py --model benchmarks/shapes/llama-3.1-8b.json \
    --prompt-lens 512 4096 [--plan sp4] [--profile]
Random weights (speed only). Floor = FLOPs / (788 TFLOP/s x the GPUs one prompt spreads over,
TP x SP), FLOPs = 2 x (matrix parameters excluding the embedding) x tokens + causal attention
(2 x 2 x layers x heads x head_dim x tokens^2 / 2) + the LM head for the one sampled row.
`--profile` adds, per rank, the device time of the operations of one more prompt of each
length (`LLM.start_profile`: NCCL's kernels included) and `busy_ms`: the profile's span and
how long the host and the device (with and without collectives) were busy in it; a rank
whose host is busy for most of the span launches slower than its kernels run."""
import argparse
import json
import random
import time

import torch

from parashift import LLM, SamplingParams

BF16_MATRIX_RATE = 788e12  # H200 dense bf16, ../shared/workloads.md


def dense_matrix_params(cfg) -> int:
    """A dense Llama-like model's matrix parameters per its config, embedding and LM head
    excluded (a plan of several ranks has no model in this process)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = cfg.hidden_size * head_dim * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    return cfg.num_hidden_layers * (attention + 3 * cfg.hidden_size * cfg.intermediate_size)


def config_prefill_flops(cfg, tokens: int) -> float:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * tokens ** 2 / 2
    return 2 * dense_matrix_params(cfg) * tokens + attention + 2 * cfg.hidden_size * cfg.vocab_size


def prefill_flops(model, tokens: int) -> float:
    """A mixture of experts' expert weights count k/E of theirs (each token runs k of E)."""
    from parashift.layers.fused_moe import FusedMoE
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    matrix_params = sum(p.numel() for name, p in model.named_parameters()
                        if p.dim() == 2 and "embed_tokens" not in name and "lm_head" not in name)
    for layer in (m for m in model.modules() if isinstance(m, FusedMoE)):
        experts = layer.experts.gate_up_proj.shape[0]
        matrix_params += sum(p.numel() for p in layer.experts.parameters()) * layer.top_k / experts
    attention = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * tokens ** 2 / 2
    return 2 * matrix_params * tokens + attention + 2 * cfg.hidden_size * cfg.vocab_size


def time_prefill(llm: LLM, length: int, vocab: int, repeats: int) -> float:
    """Median seconds from adding a `length`-token prompt (max_tokens=1) to its end: the step
    that prefills it, waited for on every rank (async scheduling returns from a step early)."""
    engine, rng = llm.llm_engine, random.Random(length)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    for i in range(repeats + 1):
        prompt = [rng.randrange(vocab) for _ in range(length)]
        start = time.perf_counter()
        engine.add_request(f"p{length}-{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]  # the first run warms up


def profile_prefill(llm: LLM, length: int, vocab: int, top: int = 15) -> list[dict]:
    """One more prompt of `length` tokens under the profiler, on every rank: the steps until
    its one token is out (no step may be in flight when the profile stops)."""
    engine, rng = llm.llm_engine, random.Random(-length)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    engine.add_request(f"profile{length}", [rng.randrange(vocab) for _ in range(length)], params)
    llm.start_profile()
    while engine.has_unfinished_requests():
        engine.step()
    summaries = llm.stop_profile()
    for summary in summaries:
        key = "device_ms" if "device_ms" in summary else "host_ms"
        summary[key] = summary[key][:top]
    return summaries


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on where possible (CUDA, triton attention)")
    p.add_argument("--mixed-step-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="with graphs, steps that prefill (up to 2,048 tokens) replay graphs too")
    p.add_argument("--plan", default="single", help="benchmarks/plans.py's names: tp4, sp4, shift-sp4")
    p.add_argument("--profile", action="store_true",
                   help="per rank, the device time of each operation of one prefill step")
    p.add_argument("--quantization", default=None, help="fp8: FP8 weights (quantized at load)")
    p.add_argument("--step-tokens", type=int, default=None,
                   help="the step's token budget (default: the longest prompt, one step each)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    from plans import plan_options
    from parashift.loader.source import load_hf_config, resolve_model
    options = plan_options(args.plan)
    longest = max(args.prompt_lens)
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=longest + 16,
              max_num_batched_tokens=args.step_tokens or longest, long_prefill_token_threshold=0,
              skip_tokenizer_init=True, quantization=args.quantization,
              enable_prefix_caching=False, cuda_graphs=args.cuda_graphs,
              mixed_step_graphs=args.mixed_step_graphs, **options)
    runner = getattr(llm.llm_engine, "runner", None)  # in this process: one rank only
    cfg = load_hf_config(resolve_model(args.model))
    gpus = options.get("tensor_parallel_size", 1) * options.get("sequence_parallel_size", 1)
    rows = []
    for length in args.prompt_lens:
        seconds = time_prefill(llm, length, cfg.vocab_size, args.repeats)
        flops = (prefill_flops(runner.model, length) if runner is not None
                 else config_prefill_flops(cfg, length))
        floor = flops / (BF16_MATRIX_RATE * gpus)
        rows.append(dict(plan=args.plan, mixed_step_graphs=args.mixed_step_graphs,
                         step_tokens=args.step_tokens or longest,
                         prompt_len=length, step_ms=seconds * 1e3,
                         tokens_per_s=length / seconds, floor_ms=floor * 1e3,
                         fraction_of_floor=floor / seconds))
        if args.profile:
            rows[-1]["profile"] = profile_prefill(llm, length, cfg.vocab_size)
        print(json.dumps(rows[-1]), flush=True)
    llm.llm_engine.shutdown()
    if args.output:
        write_rows(args.output, args.model, rows)


def write_rows(path: str, model: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        json.dump(dict(model=model, device=device, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
