"""FP8 quality on real weights (the embedded SmolLM2-135M on the CPU): perplexity over a
fixed English text (tests/quantization/quality_text.txt) and greedy agreement over 32 new
tokens on 20 prompts, for FP8 weights and FP8 weights + FP8 KV against bf16. The CPU runs
FP8 weights dequantized (weight-only rounding; the GPU's `_scaled_mm` also rounds the
activations per token). Writes benchmarks/results/fp8_quality_cpu.json.

    PYTHONPATH=. python benchmarks/fp8_quality.py [--out benchmarks/results/fp8_quality_cpu.json]
"""
import argparse
import json
import math
import subprocess
import time
from pathlib import Path

import torch

from parashift import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "quantization" / "quality_text.txt"
NEW_TOKENS = 32
DEVICE = "shared 2-core CPU, 1 thread"
# float32 beside: how far bf16 rounding alone moves greedy tokens on this model
CONFIGS = {"bf16": {}, "fp8 weights": dict(quantization="fp8"),
           "fp8 weights + fp8 KV": dict(quantization="fp8", kv_cache_dtype="fp8"),
           "float32": dict(dtype="float32")}
PROMPTS = [
    "The capital of France is", "Three primary colors are", "Water boils at",
    "The best way to learn a new language is", "Once upon a time, in a small village,",
    "The main ingredients of bread are", "A good night's sleep helps", "The moon orbits",
    "To plant a tree, you first", "The history of the printing press",
    "My favourite season is autumn because", "The train left the station and",
    "Photosynthesis is the process by which", "A healthy breakfast might include",
    "The library was quiet except for", "In mathematics, a prime number is",
    "The ocean covers most of", "When the storm passed, the children",
    "A bicycle has two wheels and", "The first step in solving any problem is",
]


def load(**options) -> LLM:
    return LLM(**{**dict(device="cpu", dtype="bfloat16", max_model_len=2048, num_blocks=160,
                         attention_backend="torch", enable_prefix_caching=False,
                         generation_config="vllm"), **options})


@torch.inference_mode()
def perplexity(llm: LLM, text: str) -> float:
    """exp of the mean negative log-likelihood of every token of `text` after its first,
    from the model's logits over the whole text (one request; a hook keeps the hidden
    states of every row)."""
    ids = llm.get_tokenizer().encode(text)
    runner = llm.llm_engine.runner
    hidden: list[torch.Tensor] = []
    hook = runner.model.register_forward_hook(lambda _m, _in, out: hidden.append(out.clone()))
    try:
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=1))
    finally:
        hook.remove()
    logits = runner.model.compute_logits(torch.cat(hidden)).float()[:len(ids)]
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(nll.item())


def greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, params)]


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> dict:
    """Tokens equal position by position, tokens before the first difference, and the
    prompts whose 32 tokens are all equal."""
    same = [sum(a == b for a, b in zip(t, r)) for t, r in zip(tokens, reference)]
    prefix = [next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), len(r))
              for t, r in zip(tokens, reference)]
    total = NEW_TOKENS * len(reference)
    return {"token_agreement": round(sum(same) / total, 4),
            "prefix_agreement": round(sum(prefix) / total, 4),
            "identical_prompts": sum(p == NEW_TOKENS for p in prefix)}


def measure() -> dict:
    text, results, reference = TEXT.read_text(), {}, None
    for name, options in CONFIGS.items():
        llm = load(**options)
        try:
            ppl, tokens = perplexity(llm, text), greedy(llm)
        finally:
            llm.llm_engine.shutdown()
        reference = reference or tokens
        results[name] = {"perplexity": round(ppl, 4), **agreement(tokens, reference)}
    base = results["bf16"]["perplexity"]
    for row in results.values():
        row["perplexity_ratio"] = round(row["perplexity"] / base, 4)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"
                                             / "fp8_quality_cpu.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # DEVICE
    results = measure()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    print(json.dumps(results, indent=1))
    Path(args.out).write_text(json.dumps(claims(results, commit), indent=1) + "\n")


def agreement_note(row: dict) -> str:
    return (f"token agreement {row['token_agreement']}, prefix {row['prefix_agreement']}, "
            f"{row['identical_prompts']}/{len(PROMPTS)} identical")


def claims(results: dict, commit: str) -> dict:
    """The results as benchmarks/results_table.py's claim records."""
    date = time.strftime("%Y-%m-%d")
    common = dict(device=DEVICE, shape="SmolLM2-135M-Instruct (embedded GGUF, dequantized)",
                  commit=commit,
                  date=date, command="PYTHONPATH=. python benchmarks/fp8_quality.py",
                  log_section="FP8 quality on SmolLM2 (issue 60)", baseline_other_call=False,
                  baseline_plan="bf16")
    records = []
    for name in ("fp8 weights", "fp8 weights + fp8 KV"):
        row, key = results[name], name.replace(" + ", "-").replace(" ", "-")
        records.append({**common, "id": f"fp8-{key}-perplexity",
                        "claim": f"{name}: perplexity on a fixed English text against bf16",
                        "workload": f"{TEXT.name}, one forward", "plan": name,
                        "metric": "perplexity", "unit": "ppl", "better": "lower",
                        "figure": row["perplexity"],
                        "baseline": results["bf16"]["perplexity"],
                        "ratio": row["perplexity_ratio"], "goal": "within 3% of bf16",
                        "headline": name == "fp8 weights"})
        records.append({**common, "id": f"fp8-{key}-greedy",
                        "claim": f"{name}: greedy tokens equal to bf16's",
                        "workload": f"{len(PROMPTS)} prompts x {NEW_TOKENS} new tokens",
                        "plan": name, "metric": "token agreement", "unit": "of tokens",
                        "better": "higher",
                        "figure": row["token_agreement"], "baseline": 1.0,
                        "ratio": row["token_agreement"],
                        "note": f"prefix agreement {row['prefix_agreement']}, "
                                f"{row['identical_prompts']}/{len(PROMPTS)} prompts identical; "
                                f"float32 against bf16: {agreement_note(results['float32'])}"})
    return {"group": "fp8", "title": "FP8 quality (SmolLM2-135M, CPU)",
            "source": "benchmarks/fp8_quality.py", "claims": records}


if __name__ == "__main__":
    main()
