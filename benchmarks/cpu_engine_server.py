"""One CPU parashift engine answering requests on stdin, for benchmarks/cpu_ab.py: the tree
it runs is whichever `parashift` its PYTHONPATH finds first (the tree under test or a
before tree), so it uses only the public `LLM` API.

Protocol: one JSON object a line on stdin, one JSON answer a line on stdout (the engine's
own prints go to stderr). {"op": "generate", "prompts": [[ids]], "new_tokens": n} ->
{"tokens": [[ids]]}; {"op": "info"} -> where parashift was imported from and the CPU GEMM
routes its runner chose (None before they existed); {"op": "profile", "prompts": ...,
"new_tokens": n, "rows": k} -> torch.profiler's top-k ops by self CPU time of one
`generate`. The first line written is {"ready": true} once the engine is built."""
import argparse
import json
import os
import sys
import time


def answer(out, doc: dict) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


def generate(llm, prompts, new_tokens: int) -> list[list[int]]:
    from parashift import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def profile(llm, prompts, new_tokens: int, rows: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    start = time.perf_counter()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(llm, prompts, new_tokens)
    return {"seconds": round(time.perf_counter() - start, 3),
            "table": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)}


def info(llm) -> dict:
    import parashift
    import torch
    choice = getattr(llm.llm_engine.runner, "cpu_gemm", None)
    return {"parashift": os.path.dirname(parashift.__file__), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_gemm": None if choice is None else choice.as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llm-args", default="{}",
                        help="JSON of more LLM(...) options (e.g. max_num_batched_tokens)")
    args = parser.parse_args()
    out, sys.stdout = sys.stdout, sys.stderr  # answers only on the real stdout
    import torch
    torch.set_num_threads(args.threads)
    from parashift import LLM
    llm = LLM(device="cpu", dtype=args.dtype, attention_backend="torch",
              enable_prefix_caching=False, max_model_len=1024, max_num_seqs=args.max_num_seqs,
              **json.loads(args.llm_args))
    answer(out, {"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "generate":
            answer(out, {"tokens": generate(llm, request["prompts"], request["new_tokens"])})
        elif request["op"] == "profile":
            answer(out, profile(llm, request["prompts"], request["new_tokens"], request["rows"]))
        else:
            answer(out, info(llm))


if __name__ == "__main__":
    main()
