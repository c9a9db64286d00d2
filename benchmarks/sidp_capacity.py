"""SiDP's KV capacity against plain DP at the same memory utilization (issue 17).

Starts the same shape twice on `-dp d [-tp t]` GPUs, plain and with --share-ffn, and reads
each rank's KV blocks. The theoretical SiDP pool is the plain one plus the FFN bytes a rank
no longer holds, (d-1)/d of its FFN shard, less its slots (each one layer's FFN shard):
    KV_theory = KV_plain + F (d - 1) / d - slots * F / L
(F: a rank's FFN bytes over all L layers). Reports KV tokens per rank, the gain over plain
DP, and the fraction of the theoretical gain reached (goal: >= 0.95). Usage (GPUs: d * t):
    PYTHONPATH=. python3 benchmarks/sidp_capacity.py --model benchmarks/shapes/qwen3-32b.json \
        -dp 2 --gpu-memory-utilization 0.9 --out sidp_capacity.json
"""
import argparse
import json

import torch


def ffn_bytes_per_rank(cfg, tp: int, dtype_bytes: int = 2) -> int:
    return cfg.num_hidden_layers * 3 * cfg.hidden_size * cfg.intermediate_size * dtype_bytes // tp


def freed_bytes(ffn: int, layers: int, dp: int, slots: int) -> float:
    """What a SiDP rank does not hold of its FFN shard, less its slots."""
    return ffn * (dp - 1) / dp - slots * ffn / layers


def block_bytes(cfg, tp: int, block_size: int, dtype_bytes: int = 2) -> int:
    """K and V of one block over every layer, for a rank's KV heads."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return (2 * cfg.num_hidden_layers * block_size * dtype_bytes
            * max(1, cfg.num_key_value_heads // tp) * head_dim)


def kv_blocks(model: str, dp: int, tp: int, utilization: float, max_model_len: int,
              **options) -> tuple[list[int], int, object]:
    """Each rank's KV blocks, the tokens per block, and the model's config."""
    from parashift import LLM
    llm = LLM(model=model, dtype="bfloat16", data_parallel_size=dp, tensor_parallel_size=tp,
              gpu_memory_utilization=utilization, max_model_len=max_model_len,
              skip_tokenizer_init=True, cuda_graphs=False, **options)
    engine = llm.llm_engine
    try:
        return list(engine.executor.rank_blocks), engine.config.block_size, engine._hf_config
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="benchmarks/shapes/qwen3-32b.json")
    parser.add_argument("-dp", "--data-parallel-size", dest="dp", type=int, default=2)
    parser.add_argument("-tp", "--tensor-parallel-size", dest="tp", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--sidp-slots", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if torch.cuda.device_count() < args.dp * args.tp:
        raise SystemExit(f"-dp {args.dp} -tp {args.tp} needs {args.dp * args.tp} GPUs, "
                         f"this machine has {torch.cuda.device_count()}")
    common = (args.model, args.dp, args.tp, args.gpu_memory_utilization, args.max_model_len)
    plain, block_size, cfg = kv_blocks(*common)
    shared, _, _ = kv_blocks(*common, share_ffn=True, sidp_slots=args.sidp_slots)
    ffn = ffn_bytes_per_rank(cfg, args.tp)
    freed = freed_bytes(ffn, cfg.num_hidden_layers, args.dp, args.sidp_slots)
    theory = min(plain) + freed / block_bytes(cfg, args.tp, block_size)
    result = {
        "model": args.model, "dp": args.dp, "tp": args.tp,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "device": torch.cuda.get_device_name(0),
        "kv_tokens_plain": min(plain) * block_size, "kv_tokens_shared": min(shared) * block_size,
        "kv_tokens_theory": int(theory * block_size),
        "gain": min(shared) / min(plain), "gain_theory": theory / min(plain),
        "fraction_of_theory": (min(shared) - min(plain)) / (theory - min(plain)),
        "ffn_bytes_per_rank": ffn, "freed_bytes_per_rank": freed,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
