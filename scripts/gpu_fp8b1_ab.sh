#!/usr/bin/env bash
# Issues 60/61 (helper fp8b1), the final call on ONE H200, in this order (BUDGET_S, 120 by
# default, cutting the last first):
# 1. the GPU checks of what is now on by default: SiLU·mul in the gate_up GEMV chosen with the
#    unfused GEMV's bits (kernel level), and an engine's greedy tokens with it equal to those
#    without (tiny Llama, bf16 and FP8, CUDA graphs); the sampler taking the argmax kernel;
# 2. 8B-shape decode (b1, b64, context 1024, CUDA graphs, PDL as by default), this tree (with
#    $AFTER_ENV set, empty by default: the defaults) against $BEFORE's: fp8 after, fp8 before,
#    bf16 after, bf16 before.
# Then a summary on stdout and in $OUT/summary.txt.
# Usage (repository root; $BEFORE unpacked there): OUT=dir BEFORE=.before [BUDGET_S=120]
#   [AFTER_ENV="PARASHIFT_SILU_GEMV=0 ..."] bash scripts/gpu_fp8b1_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-120}
here=$(pwd)
before=$here/${BEFORE:?the tree before, unpacked in the repository root}
after_env=${AFTER_ENV-}
mkdir -p "$OUT"
source scripts/budget_step.sh
decode() {  # tree (before | after), weights (fp8 | bf16), seconds it needs
  local tree=$1 weights=$2 need=$3 dir=$here quant=() envs=()
  [ "$tree" = before ] && dir=$before
  [ "$tree" = after ] && read -ra envs <<< "$after_env"
  [ "$weights" = fp8 ] && quant=(--quantization fp8)
  budget_step "decode_${weights}_$tree" "$need" bash -c 'cd "$1" && shift && PYTHONPATH="$(pwd)" exec "$@"' \
    _ "$dir" env ${envs[@]+"${envs[@]}"} python3 benchmarks/decode_throughput.py \
    --model "$here/benchmarks/shapes/llama-3.1-8b.json" --batch-sizes 1 64 --context 1024 \
    --decode-steps 32 ${quant[@]+"${quant[@]}"} --output "$OUT/decode_${weights}_$tree.json"
}
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_gated_gemv.py tests/kernels/test_argmax.py -k "measured_choice or sampler_takes"
budget_step engine_tokens 50 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider tests/layers/test_silu_gemv.py -k "fused_engine and gate_up"
decode after fp8 45
decode before fp8 35
decode after bf16 35
decode before bf16 30
python3 - "$OUT" "$after_env" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, sys
out, after_env = sys.argv[1:]
print("== fp8b1 decode A/B, after with:", after_env or "(defaults)")
for line in open(f"{out}/steps") if os.path.exists(f"{out}/steps") else []:
    print("  step", line.strip())
runs = {tuple(os.path.basename(p)[7:-5].split("_")): json.load(open(p))
        for p in sorted(glob.glob(f"{out}/decode_*.json"))}
for (weights, tree), doc in sorted(runs.items()):
    print(f"  {weights} {tree:6s}: " + " | ".join(
        f"b{r['batch']} {r['step_ms']:.3f} ms ({r['fraction_of_floor']:.3f}) "
        f"{r['tokens_per_s']:.0f} tok/s" for r in doc["rows"]))
for weights in ("fp8", "bf16"):
    a, b = runs.get((weights, "after")), runs.get((weights, "before"))
    if a and b:
        print(f"  {weights} before/after: " + " ".join(
            f"b{ra['batch']} {rb['step_ms'] / ra['step_ms']:.3f}x"
            for ra, rb in zip(a["rows"], b["rows"])))
for (weights, tree), doc in sorted(runs.items()):
    chosen = [c for c in doc.get("fp8_gemm", []) if c["rows_up_to"] == 1] + \
             [c for c in doc.get("skinny_gemm", []) if c.get("rows") == 1] + \
             [c for c in doc.get("gated_gemv", []) if c.get("rows") == 1]
    print(f"  {weights} {tree} chose at 1 row:", "; ".join(
        f"{c['weight']} {c['kernel']}" for c in chosen))
PY
