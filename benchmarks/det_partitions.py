"""Deterministic attention's fixed partition and KV tile against the default mode: prefill
of one prompt and decode at a few batch sizes, each setting in a fresh process (the
settings are read at import: PARASHIFT_DETERMINISTIC_ATTENTION_PARTITION,
PARASHIFT_DETERMINISTIC_ATTENTION_TILE_N and, where given,
PARASHIFT_DETERMINISTIC_UNSPLIT_MERGE), the default mode first and last. A row's bits follow
the partition, so one size serves every batch: this shows what each costs where.

Usage (one GPU, from the repository root):
  PYTHONPATH=. python3 benchmarks/det_partitions.py --settings 1024:128 128:128 128:64
  ... --settings 1024:128:reduction 1024:128:program"""
import argparse
import json
import os
import subprocess
import sys
import types


def measure(model: str, device: str, deterministic: bool, batch_sizes: list[int],
            context: int, prefill: int, steps: int) -> dict:
    from benchmarks.deterministic import decode_seconds, prefill_seconds
    from parashift import LLM
    args = types.SimpleNamespace(device=device, decode_steps=steps)
    llm = LLM(model=model, device=device, dtype="bfloat16" if device == "cuda" else "float32",
              max_model_len=max(prefill, context + steps) + 64, max_num_seqs=max(batch_sizes),
              skip_tokenizer_init=True, enable_prefix_caching=False, deterministic=deterministic)
    vocab = llm.llm_engine.vocab_size
    row = dict(prefill_ms=1e3 * prefill_seconds(args, llm, vocab, prefill))
    for batch in batch_sizes:
        row[f"b{batch}_ms"] = 1e3 * decode_seconds(args, llm, batch, vocab, context)
    llm.llm_engine.shutdown()
    return row


def run_setting(args, setting: str | None) -> dict:
    """`setting` "PARTITION:TILE[:MERGE]" in deterministic mode, None for the default mode."""
    env = dict(os.environ)
    if setting is not None:
        partition, tile, *merge = setting.split(":")
        env.update(PARASHIFT_DETERMINISTIC_ATTENTION_PARTITION=partition,
                   PARASHIFT_DETERMINISTIC_ATTENTION_TILE_N=tile)
        if merge:
            env.update(PARASHIFT_DETERMINISTIC_UNSPLIT_MERGE=merge[0])
    command = [sys.executable, __file__, "--child", "det" if setting else "default",
               "--model", args.model, "--device", args.device, "--context", str(args.context),
               "--prefill", str(args.prefill), "--decode-steps", str(args.decode_steps),
               "--batch-sizes", *map(str, args.batch_sizes)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    rows = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not rows:
        return dict(setting=setting or "default", error=out.stderr.strip().splitlines()[-1:])
    return dict(setting=setting or "default", **json.loads(rows[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="benchmarks/shapes/llama-3.1-8b.json")
    p.add_argument("--settings", nargs="+", default=["1024:128", "128:128"],
                   metavar="PARTITION:TILE[:MERGE]")
    p.add_argument("--device", default="cuda", help="cpu: a smoke check of the script")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--prefill", type=int, default=4096)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--child", choices=["det", "default"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.device, args.child == "det", args.batch_sizes,
                                 args.context, args.prefill, args.decode_steps)), flush=True)
        return
    for setting in [None, *args.settings, None]:
        print(json.dumps(run_setting(args, setting)), flush=True)


if __name__ == "__main__":
    main()
