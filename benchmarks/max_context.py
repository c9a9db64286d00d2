"""Max context per layout width (Flying Serving's Table 2): starts N replicas under the
flying policy (one replica or group: static) and prints, for every width the node can take, its layout, the KV tokens one
of its groups holds and the longest context it serves (that, at most max_model_len), as
JSON lines.

    python benchmarks/max_context.py --model benchmarks/shapes/llama-3.1-8b.json -dp 2
    python benchmarks/max_context.py --model benchmarks/shapes/llama-3.1-70b.json \
        --layout tp2,tp2   # a model one GPU cannot hold: two TP=2 replicas"""
import argparse
import json

from parashift import LLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("-dp", "--data-parallel-size", type=int, default=2)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--layout", default=None,
                   help="the replicas as groups instead of -dp, e.g. tp2,tp2 (a model one GPU "
                        "cannot hold)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu (the CPU check)")
    args = p.parse_args()
    replicas = {"layout": args.layout} if args.layout else \
        {"data_parallel_size": args.data_parallel_size}
    flying = "," in args.layout if args.layout else args.data_parallel_size > 1
    llm = LLM(model=args.model, dtype="bfloat16", skip_tokenizer_init=True, device=args.device,
              **replicas, parallel_policy="flying" if flying else "static",
              gpu_memory_utilization=args.gpu_memory_utilization,
              max_model_len=args.max_model_len, cuda_graphs=False)
    engine = llm.llm_engine
    pool = engine.kv_tokens_by_width()
    for width in engine.layout_info()["widths"]:
        print(json.dumps({**width, "kv_tokens": pool[width["width"]],
                          "max_model_len": engine.max_model_len}), flush=True)
    engine.shutdown()


if __name__ == "__main__":
    main()
