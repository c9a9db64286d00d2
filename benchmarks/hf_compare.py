"""Offline throughput of parashift beside Hugging Face transformers `generate` on the
same GPU, same prompts, same random bf16 weights (speed only).

Usage (GPU): python3 benchmarks/hf_compare.py --model benchmarks/shapes/llama-3.1-8b.json \
    --num-prompts 64 --output-len 256 --output hf.json
Prompts are the `chat` workload's first N (input ~ U(100, 1024), seed 0); every request
generates exactly --output-len tokens (ignore_eos) because HF `generate` gives a batch one
length. HF runs the whole batch at once (left padding, dynamic KV cache, sdpa)."""
import argparse
import json
import time

import torch

from parashift import LLM, SamplingParams
from parashift.bench.prompts import fill_token_prompts
from parashift.bench.workloads import WorkloadOptions, build_phases, get_workload


def chat_prompts(n: int, vocab: int) -> list[list[int]]:
    options = WorkloadOptions(num_requests=n)
    requests = build_phases(get_workload("chat"), options)[0].requests
    fill_token_prompts(requests, options.seed, vocab)
    return [r.prompt for r in requests]


def run_parashift(llm: LLM, prompts, output_len: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    # Warm-up over the same batch, so the Triton kernels of its mixed steps are compiled.
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                 use_tqdm=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return time.perf_counter() - start


def hf_model_like(llm: LLM, device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """A transformers model of the same config holding parashift's random weights (a
    mixture of experts' stacked experts as transformers >= 5 keeps them, gate_up [E, 2I, H]
    and down [E, H, I], like parashift)."""
    from transformers import AutoModelForCausalLM
    ours = llm.llm_engine.runner.model
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(ours.config, dtype=dtype,
                                                 attn_implementation="sdpa")
    state = {}
    for name, p in ours.named_parameters():
        state[name] = p
    hf_state = model.state_dict()
    with torch.no_grad():
        for name, t in hf_state.items():
            t.copy_(_hf_tensor(name, state, ours.config))
    return model.eval()


def _hf_tensor(name: str, ours: dict, cfg) -> torch.Tensor:
    """HF parameter `name` from parashift's packed parameters."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q = cfg.num_attention_heads * head_dim
    kv = cfg.num_key_value_heads * head_dim
    packed = {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, kv),
              "v_proj": ("qkv_proj", q + kv, kv),
              "gate_proj": ("gate_up_proj", 0, cfg.intermediate_size),
              "up_proj": ("gate_up_proj", cfg.intermediate_size, cfg.intermediate_size)}
    for hf_name, (our_name, start, size) in packed.items():
        if f".{hf_name}." in name:
            return ours[name.replace(hf_name, our_name)].narrow(0, start, size)
    if name not in ours:
        raise KeyError(f"transformers' parameter {name} has no parashift counterpart (a "
                       "mixture of experts needs transformers >= 5's stacked experts)")
    return ours[name]


def run_hf(model, prompts, output_len: int) -> float:
    pad = 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=output_len,
                  min_new_tokens=output_len, pad_token_id=pad)
    with torch.inference_mode():
        model.generate(ids[:2, -16:], attention_mask=mask[:2, -16:], do_sample=False,
                       max_new_tokens=4, pad_token_id=pad)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, **kwargs)
        torch.cuda.synchronize()
    assert out.shape[1] == width + output_len
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on where possible (CUDA, triton attention)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.6,
                   help="parashift's share of the GPU: the rest must hold transformers' copy")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=2048, skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=args.cuda_graphs,
              gpu_memory_utilization=args.gpu_memory_utilization)
    prompts = chat_prompts(args.num_prompts, llm.llm_engine.vocab_size)
    output_tokens = args.num_prompts * args.output_len
    ours = run_parashift(llm, prompts, args.output_len)
    hf = run_hf(hf_model_like(llm), prompts, args.output_len)
    result = dict(model=args.model, device=torch.cuda.get_device_name(), prompts=args.num_prompts,
                  input_tokens=sum(map(len, prompts)), output_tokens=output_tokens,
                  parashift_s=ours, hf_s=hf, parashift_out_tok_s=output_tokens / ours,
                  hf_out_tok_s=output_tokens / hf, speedup=hf / ours)
    print(json.dumps(result), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
