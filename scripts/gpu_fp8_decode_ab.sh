#!/usr/bin/env bash
# Issue 60, FP8 decode nearer the bytes floor (helper fp8dec): the GEMV configs that load a
# weight tile ahead and the split-K configs summed by tickets (kernels/split_tickets.py), on
# ONE GPU, this tree against $BEFORE's (the tree before them), in this order (what BUDGET_S
# leaves out last):
# 1. the GPU tests of the new configs (bf16: every ahead and ticket GEMV config on two odd
#    shapes, the ticket GEMM configs at 33 rows; bit-stable, counters back at 0);
# 2. 8B-shape decode (b1, b64, context 1024, CUDA graphs, PDL as by default), FP8 weights:
#    before, after (round 1), then bf16 after, then FP8 after with a kernel profile and
#    before (round 2: the second round runs this tree first);
# 3. where time is left: the weight kernels' same bits with PDL off, early and late (the new
#    configs among them).
# Then ONE summary on stdout and in $OUT/summary.txt: each step's rc and seconds, each
# decode run's step ms and fraction of the floor, before/after by round and best of rounds,
# FP8 b1 tokens/s over bf16's, the FP8 GEMM kernels each tree chose at 1 and 64 rows, and
# the profile's top kernels. $OUT gets 4 files: summary.txt, decode.json (every run),
# failures.log (the end of each failed step's log, where one failed) and logs.tar.gz.
# Usage (repository root; $BEFORE unpacked there, e.g. mkdir .before && git archive 5ad0e89 |
# tar -x -C .before): OUT=dir BEFORE=.before [BUDGET_S=280] bash scripts/gpu_fp8_decode_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-280}
here=$(pwd)
before=$here/${BEFORE:?the tree before, unpacked in the repository root}
WORK=${WORK:-$(mktemp -d /tmp/fp8dec_ab.XXXX)}
S=$here/benchmarks/shapes
mkdir -p "$OUT" "$WORK"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', \
triton.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())" \
  > "$WORK/versions.log" 2>&1
source scripts/budget_step.sh
export STEP_DIR=$WORK FAILURES_LOG=$OUT/failures.log
decode() {  # tree (before | after), weights (fp8 | bf16), round, seconds it needs, extra flags
  local tree=$1 weights=$2 round=$3 need=$4; shift 4
  local dir=$here quant=()
  [ "$tree" = before ] && dir=$before
  [ "$weights" = fp8 ] && quant=(--quantization fp8)
  local name="decode_${weights}_${tree}_$round"
  budget_step "$name" "$need" bash -c 'cd "$1" && shift && PYTHONPATH="$(pwd)" exec "$@"' _ \
    "$dir" python3 benchmarks/decode_throughput.py --model "$S/llama-3.1-8b.json" \
    --batch-sizes 1 64 --context 1024 --decode-steps 32 ${quant[@]+"${quant[@]}"} "$@" \
    --output "$WORK/$name.json"
}
# two GEMV cases (1 row, K 128; 4 rows, K 1000 split unevenly, strided x) and one GEMM case
# (33 rows, K 200, bias): each compiles every new config (~30 kernels)
budget_step gpu_tests 40 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv.py tests/kernels/test_fp8_gemm.py -k "(test_cuda and bfloat16 and \
  (ahead or tickets) and (128 or 1000)) or (tickets_cuda and bfloat16 and 200)"
decode before fp8 1 50
decode after fp8 1 90
decode after bf16 1 30
decode after fp8 2 35 --profile
decode before fp8 2 30
budget_step pdl_bits 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_pdl.py -k weight_kernels_give_the_same_bits
tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
python3 - "$WORK" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, sys
work, out = sys.argv[1:]
versions = open(f"{work}/versions.log").read().strip().splitlines() or ["?"]
print("== FP8 decode A/B (fp8dec):", versions[-1][:200])
steps = f"{work}/steps"
for line in open(steps) if os.path.exists(steps) else []:
    print("  step", line.strip())
runs = {}  # (weights, tree, round) -> the run's JSON
for path in sorted(glob.glob(f"{work}/decode_*.json")):
    _, weights, tree, rnd = os.path.basename(path)[:-5].split("_")
    runs[weights, tree, rnd] = json.load(open(path))
json.dump({"_".join(k): v for k, v in runs.items()}, open(f"{out}/decode.json", "w"), indent=1)
print("== decode_throughput 8B, context 1024 (ms a step; fraction of the floor; tokens/s)")
for (weights, tree, rnd), doc in sorted(runs.items()):
    print(f"  {weights} {tree:6s} round {rnd}: " + " | ".join(
        f"b{r['batch']} {r['step_ms']:.3f} ms ({r['fraction_of_floor']:.3f}) "
        f"{r['tokens_per_s']:.0f} tok/s" for r in doc["rows"]) + f" | pdl {doc.get('pdl')}")
step = {}  # (tree, batch) -> [(round, ms)]
for (weights, tree, rnd), doc in runs.items():
    if weights == "fp8":
        for r in doc["rows"]:
            step.setdefault((tree, r["batch"]), []).append((rnd, r["step_ms"], r["floor_ms"]))
print("== FP8 before / after (> 1: after faster)")
for batch in sorted({b for _, b in step}):
    b, a = dict((r, ms) for r, ms, _ in step.get(("before", batch), [])), \
        dict((r, ms) for r, ms, _ in step.get(("after", batch), []))
    each = " ".join(f"round {r} {b[r] / a[r]:.3f}x" for r in sorted(set(a) & set(b)))
    if a and b:
        floor = step[("after", batch)][0][2]
        print(f"  b{batch}: before {min(b.values()):.3f} ms, after {min(a.values()):.3f} ms "
              f"(best of rounds): {min(b.values()) / min(a.values()):.3f}x; {each}; after "
              f"{floor / min(a.values()):.3f} of the floor (goal {0.85 if batch == 1 else 0.8})")
bf16 = runs.get(("bf16", "after", "1"))
for rnd in ("1", "2"):
    fp8 = runs.get(("fp8", "after", rnd))
    if bf16 and fp8:
        print(f"  FP8 (round {rnd}) / bf16 tokens/s: " + " ".join(
            f"b{f['batch']} {f['tokens_per_s'] / b['tokens_per_s']:.3f}x"
            for f, b in zip(fp8["rows"], bf16["rows"])))
for (weights, tree, rnd), doc in sorted(runs.items()):
    chosen = [c for c in doc.get("fp8_gemm", []) if c["rows_up_to"] in (1, 64)] + \
             [c for c in doc.get("skinny_gemm", []) if c.get("rows") == 1]
    if chosen and rnd == "1":
        print(f"  {weights} {tree} chose:", "; ".join(
            f"{c.get('rows_up_to', c.get('rows'))}x{c['weight']} {c['kernel']}" for c in chosen))
    for r in doc["rows"]:
        p = r.get("profile")
        if p:  # ms a step of the kernels (under PDL a kernel's span includes its wait)
            print(f"  {weights} {tree} b{r['batch']} profile: busy {p['gpu_busy_ms']:.3f} span "
                  f"{p['kernel_span_ms']:.3f} |", "; ".join(
                      f"{n[:50]} {t}" for n, t in p["top_kernels"][:10]))
PY
