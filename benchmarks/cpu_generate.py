"""The CPU path beside transformers: parashift `LLM.generate` and transformers `generate` on
the embedded SmolLM2 (the same GGUF, dequantized by both), same prompts, same threads.

Usage: python3 benchmarks/cpu_generate.py [--threads 2] [--batches 1 16] [--dtypes float32
bfloat16] [--backends torch torch-unpacked [torch-ref]] [--prompt-len 64] [--new-tokens 64] [--repeats 3]
[--output out.json]
Every batch is --prompt-len random token ids per prompt (no padding for transformers) and
every request makes exactly --new-tokens tokens (greedy, no EOS stop). `tokens_per_s`:
batch x new tokens over the whole `generate` call (prompt included); `first_token_ms`: a
`generate` of one new token. The runs of one (batch, dtype) are interleaved, their order
rotated each repeat (the machine is shared), and each figure is the median of --repeats.
`--backends torch-ref` measures the per-sequence reference attention (the engine before
torch_fast) in the same call; `torch-unpacked` the `torch` backend with its GEMMs on the
plain weights (`F.linear`: the engine before layers/cpu_packed.py). `greedy_match`: the share
of parashift's tokens equal to transformers' (1.0 expected in fp32; bf16 rounding may part
them)."""
import argparse
import json
import random
import statistics
import time

import torch

from parashift import LLM, SamplingParams
from parashift.layers.cpu_packed import unpack_cpu_weights
from parashift.loader.source import embedded_gguf_path

UNPACKED = "-unpacked"  # a backend name's suffix: the same engine on plain weights


def prompts_of(batch: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 10_000) for _ in range(length)] for _ in range(batch)]


def parashift_run(llm: LLM):
    def run(prompts, new_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]
    return run


def transformers_run(model):
    @torch.inference_mode()
    def run(prompts, new_tokens):
        ids = torch.tensor(prompts)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=0, temperature=None, top_p=None, top_k=None)
        return out[:, ids.shape[1]:].tolist()
    return run


def load_transformers(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    path = embedded_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                 attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    return model.eval()


def timed(run, prompts, new_tokens) -> tuple[float, list]:
    start = time.perf_counter()
    tokens = run(prompts, new_tokens)
    return time.perf_counter() - start, tokens


def measure(runs: dict, prompts, new_tokens: int, repeats: int) -> dict:
    """name -> medians of tokens/s and first-token ms over interleaved, rotated repeats."""
    warm_up(runs, prompts)
    samples = new_samples(runs)
    for r in range(repeats):
        one_round(runs, prompts, new_tokens, r, samples)
    return summarize(samples, len(prompts) * new_tokens)


def warm_up(runs: dict, prompts) -> None:
    for run in runs.values():  # first calls allocate and pick kernels
        run(prompts, 4)


def new_samples(runs: dict) -> dict:
    return {"seconds": {n: [] for n in runs}, "firsts": {n: [] for n in runs}, "tokens": {}}


def one_round(runs: dict, prompts, new_tokens: int, r: int, samples: dict) -> None:
    """Each run once (a one-token `generate`, then the timed one), in an order rotated by
    the round's number r."""
    names = list(runs)
    for name in names[r % len(names):] + names[:r % len(names)]:
        first, _ = timed(runs[name], prompts, 1)
        seconds, samples["tokens"][name] = timed(runs[name], prompts, new_tokens)
        samples["firsts"][name].append(first * 1e3)
        samples["seconds"][name].append(seconds)


def summarize(samples: dict, tokens_a_run: int) -> dict:
    """name -> medians, every run's figure and the greedy match against transformers'."""
    reference = samples["tokens"]["transformers"]
    out = {}
    for name, seconds in samples["seconds"].items():
        rates = [tokens_a_run / s for s in seconds]
        firsts = samples["firsts"][name]
        out[name] = {"tokens_per_s": round(statistics.median(rates), 1),
                     "first_token_ms": round(statistics.median(firsts), 1),
                     "tokens_per_s_runs": [round(x, 1) for x in rates],
                     "first_token_ms_runs": [round(x, 1) for x in firsts],
                     "greedy_match": _match(samples["tokens"][name], reference)}
    return out


def _match(ours: list[list[int]], theirs: list[list[int]]) -> float:
    same = sum(a == b for x, y in zip(ours, theirs) for a, b in zip(x, y))
    return round(same / sum(len(y) for y in theirs), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    # torch-ref (the per-sequence path, the slowest) only when asked: the default call is
    # to fit in ~6 minutes on the quiet host (scripts/cpu_quiet_runs.sh)
    parser.add_argument("--backends", nargs="+", default=["torch", "torch-unpacked"])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results, gemm_routes = [], {}
    for dtype in args.dtypes:
        runs = {"transformers": transformers_run(load_transformers(getattr(torch, dtype)))}
        for backend in args.backends:
            llm = LLM(device="cpu", dtype=dtype, attention_backend=backend.removesuffix(UNPACKED),
                      enable_prefix_caching=False, max_model_len=1024,
                      max_num_seqs=max(args.batches))
            if backend.endswith(UNPACKED):
                unpack_cpu_weights(llm.llm_engine.runner.model)
            else:  # the GEMM routes timed at start-up (layers/cpu_gemm_choice.py)
                gemm_routes[f"{dtype}/{backend}"] = llm.llm_engine.runner.cpu_gemm.as_dict()
            runs[f"parashift/{backend}"] = parashift_run(llm)
        for batch in args.batches:
            prompts = prompts_of(batch, args.prompt_len)
            row = {"dtype": dtype, "batch": batch,
                   **measure(runs, prompts, args.new_tokens, args.repeats)}
            print(json.dumps(row), flush=True)
            results.append(row)
    doc = {"threads": args.threads, "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
           "repeats": args.repeats, "seconds": round(time.perf_counter() - started),
           "results": results, "cpu_gemm": gemm_routes}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
