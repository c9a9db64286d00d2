"""What a runner's CUDA graphs cost at start-up: capture seconds, the graphs, and the device
memory the capture takes (reserved and allocated, before against after), with and without
the wide mixed buckets (worker/cuda_graphs.py WIDE_SEQS, PARASHIFT_MIXED_GRAPH_WIDE_SEQS).
One engine a run (random weights), the offline defaults of `bench throughput`; `--layers`
cuts the model to fewer layers (capture time grows with the layers' launches, the graphs'
memory pool with a step's activations, which a layer reuses).

Usage (GPU): PYTHONPATH=. python3 benchmarks/graph_capture_cost.py --wide-seqs 0 256 \
    [--model benchmarks/shapes/llama-3.1-8b.json] [--layers 8] [--max-model-len 8192]
    [--output FILE]"""
import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from parashift import LLM
from parashift.worker import cuda_graphs
from parashift.worker.model_runner import ModelRunner


def capture_cost(model: str, wide_seqs: int, max_model_len: int, budget: int) -> dict:
    """One engine's graph capture with `wide_seqs` (0: no wide buckets)."""
    cuda_graphs.WIDE_SEQS = wide_seqs
    seen, capture = {}, ModelRunner._capture_graphs

    def timed(runner):
        torch.cuda.synchronize()
        before = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
        start = time.perf_counter()
        graphs = capture(runner)
        torch.cuda.synchronize()
        seen.update(seconds=time.perf_counter() - start,
                    reserved_mib=(torch.cuda.memory_reserved() - before[0]) / 2 ** 20,
                    allocated_mib=(torch.cuda.memory_allocated() - before[1]) / 2 ** 20,
                    graphs=len(graphs.graphs),
                    mixed=[[b.rows, b.seqs] for b in graphs.sizes.mixed])
        return graphs
    ModelRunner._capture_graphs = timed
    try:
        llm = LLM(model=model, dtype="bfloat16", max_model_len=max_model_len,
                  max_num_batched_tokens=budget, skip_tokenizer_init=True)
        seen["kv_blocks"] = llm.llm_engine.runner.kv.num_blocks
        llm.llm_engine.shutdown()
        del llm
    finally:
        ModelRunner._capture_graphs = capture
        gc.collect()
        torch.cuda.empty_cache()
    return dict(wide_seqs=wide_seqs, **seen)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    parser.add_argument("--wide-seqs", type=int, nargs="+", default=[0, 256])
    parser.add_argument("--layers", type=int, default=None, help="default: the model's")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--budget", type=int, default=16384, help="max_num_batched_tokens")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model = args.model
        if args.layers:
            config = dict(json.loads(Path(model).read_text()), num_hidden_layers=args.layers)
            model = str(Path(folder) / Path(model).name)
            Path(model).write_text(json.dumps(config))
        for wide in args.wide_seqs:
            rows.append(capture_cost(model, wide, args.max_model_len, args.budget))
            print(json.dumps(rows[-1]), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(model=args.model, layers=args.layers,
                           device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
