"""Prefill of one long prompt in one step, beside the bf16 matrix-rate floor.

Usage (GPU): python3 benchmarks/prefill_throughput.py --model benchmarks/shapes/llama-3.1-8b.json \
    --prompt-lens 512 4096
Random weights (speed only). Floor = FLOPs / 788 TFLOP/s, FLOPs = 2 x (matrix parameters
excluding the embedding) x tokens + causal attention (2 x 2 x layers x heads x head_dim x
tokens^2 / 2) + the LM head for the one sampled row."""
import argparse
import json
import random
import time

import torch

from parashift import LLM, SamplingParams

BF16_MATRIX_RATE = 788e12  # H200 dense bf16, ../shared/workloads.md


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
    """Median seconds of the engine step that prefills a `length`-token prompt."""
    engine, rng = llm.llm_engine, random.Random(length)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    for i in range(repeats + 1):
        engine.add_request(f"p{length}-{i}", [rng.randrange(vocab) for _ in range(length)], params)
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        while engine.has_unfinished_requests():
            engine.step()
    return sorted(times[1:])[len(times[1:]) // 2]  # the first run warms up


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on where possible (CUDA, triton attention)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    longest = max(args.prompt_lens)
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=longest + 16,
              max_num_batched_tokens=longest, long_prefill_token_threshold=0,
              skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=args.cuda_graphs)
    model = llm.llm_engine.runner.model
    rows = []
    for length in args.prompt_lens:
        seconds = time_prefill(llm, length, model.config.vocab_size, args.repeats)
        floor = prefill_flops(model, length) / BF16_MATRIX_RATE
        rows.append(dict(prompt_len=length, step_ms=seconds * 1e3, tokens_per_s=length / seconds,
                         floor_ms=floor * 1e3, fraction_of_floor=floor / seconds))
        print(json.dumps(rows[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(model=args.model, device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
