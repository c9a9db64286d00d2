"""The cost of a verification step (speculative decoding) against a plain decode step.

Usage (GPU): python3 benchmarks/spec_verify.py --model benchmarks/shapes/llama-3.1-8b.json \
    --batch-sizes 1 4 16 64 --ks 1 2 3 4 5 6 7 8 --context 1024 --steps 16 \
    [--draft-model benchmarks/shapes/llama-3.2-1b.json] --output verify.json
Random weights (speed only). One engine (speculation on, so async scheduling off in both
columns); for each batch, `steps` engine steps of plain decodes (the proposer drafts
nothing), then of verifications of exactly k draft tokens a sequence (a proposer that
always drafts k tokens, no back-off: the cost, not the acceptance). With --draft-model the
draft model proposes (k draft-model steps on the same device) and the step time is draft +
verification. Each row: ms per step, and the ratio to the plain step: a draft of k tokens
pays where its expected accepted length exceeds it."""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_throughput import batch_state, start_decodes  # noqa: E402

from parashift import LLM  # noqa: E402
from parashift.spec_decode import draft_model  # noqa: E402


def fixed_drafts(speculator, k: int | None) -> None:
    """Every decoding sequence drafts k tokens (None: none), never backing off."""
    speculator._backing_off = lambda request_id: False
    proposer = speculator.proposer
    if not hasattr(proposer, "_original_propose_all"):
        proposer._original_propose_all = proposer.propose_all
    if k is None:
        proposer.propose_all = lambda items: [[] for _ in items]
    elif speculator.config.method == "draft_model":
        speculator.k = k
        proposer.propose_all = proposer._original_propose_all
    else:
        proposer.propose_all = lambda items: [[1] * min(k, room) for _, _, room in items]
    speculator.k = k or speculator.k


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_steps(engine, steps: int) -> float:
    """ms per engine step over `steps` steps (the batch must not change)."""
    sync()
    before = batch_state(engine)["running"]
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    if batch_state(engine)["running"] != before:
        raise RuntimeError("the batch changed while timed")
    return 1e3 * (time.perf_counter() - start) / steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--draft-model", default=None, help="a draft shape (e.g. llama-3.2-1b.json)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--ks", type=int, nargs="+", default=list(range(1, 9)))
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--draft-cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="the draft model's own CUDA graphs (default: spec_decode.draft_model's)")
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if args.draft_cuda_graphs is not None:
        draft_model.DRAFT_GRAPHS = args.draft_cuda_graphs
    spec = ({"method": "draft_model", "model": args.draft_model} if args.draft_model
            else {"method": "ngram"})
    spec["num_speculative_tokens"] = max(args.ks)
    # room for every timed step to add up to k + 1 tokens a sequence
    max_len = args.context + (len(args.ks) + 1) * args.steps * (max(args.ks) + 1) + 64
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=max_len,
              max_num_seqs=max(args.batch_sizes), skip_tokenizer_init=True,
              enable_prefix_caching=False, cuda_graphs=args.cuda_graphs,
              speculative_config=spec)
    engine = llm.llm_engine
    vocab = engine.vocab_size
    rows = []
    for batch in args.batch_sizes:
        ids = start_decodes(engine, batch, args.context, vocab)
        fixed_drafts(engine.speculator, None)
        plain = time_steps(engine, args.steps)
        for k in args.ks:
            fixed_drafts(engine.speculator, k)
            engine.step()  # (a first verification of this shape: graphs, allocations)
            ms = time_steps(engine, args.steps)
            rows.append(dict(batch=batch, k=k, plain_decode_ms=round(plain, 3),
                             step_ms=round(ms, 3), ratio=round(ms / plain, 3),
                             tokens_per_step=batch * (k + 1)))
            print(json.dumps(rows[-1]), flush=True)
        for rid in ids:
            engine.abort_request(rid)
        engine.step()
    summary = dict(model=args.model, draft_model=args.draft_model, context=args.context,
                   draft_cuda_graphs=draft_model.DRAFT_GRAPHS,
                   device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                   rows=rows)
    print(json.dumps(summary, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
