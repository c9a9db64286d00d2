#!/usr/bin/env bash
# (Session 49's call script as it ran; PARASHIFT_ATTN_ROPE_PREFETCH was removed in session 50:
# its variants below now run the fold without the prefetch.)
# Issues 60/61 (session 49, helper rope64b): why the one-launch decode kernel's RoPE fold
# (PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1, default 0) gave other bits than the rotary kernel then the
# one-launch kernel on an H200, and its cost, on ONE H200, in priority order (BUDGET_S, 120 by
# default on a warm machine: ~120 s; the last step is skipped first, BUDGET_S=180 runs it):
# 1. diag (~35 s, compiles included): benchmarks/rope_fold_diag.py at 8B heads (bf16, 64 rows
#    unsplit, 8 rows at 4 splits, with and without q/k norms): which of out / K pool / V pool
#    differ, where (rows, heads, slots), and whether they still do when each path runs twice,
#    when the new slots already hold the key and value, at position 0 (an exact rotation) and
#    with one stage (no cp.async pipelining);
# 2. gpu_tests (~20 s): the fold against the pair at 8B heads and the small cases in bf16 (on
#    CUDA now: the V pool bit for bit, the output and K pool within tolerance), and the fold
#    with its first tiles prefetched (PARASHIFT_ATTN_ROPE_PREFETCH=1) against the fold, bit
#    for bit;
# 3. engine_fp8 (~65 s): decode_throughput 8B FP8 b64 (context 1024, CUDA graphs): default
#    against PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1 and against it with PARASHIFT_ATTN_ROPE_PREFETCH=1,
#    graph variants in one engine, 3 rounds in turn;
# 4. engine_bf16 (~50 s): the same in bf16 (session 49's run: 0.991x, each round slower),
#    with a GPU kernel breakdown of the default's and the fold's first round (is it the
#    attention kernel that got slower, or the gaps around it?).
# Usage (repository root): OUT=dir [BUDGET_S=120] bash scripts/gpu_rope64b.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-120}
mkdir -p "$OUT"
source scripts/budget_step.sh
ENGINE="--model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 64 --context 1024 \
  --decode-steps 32 --cuda-graphs --rounds 3 --graph-variants PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1 \
  PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1,PARASHIFT_ATTN_ROPE_PREFETCH=1"
budget_step diag 35 python3 benchmarks/rope_fold_diag.py --output "$OUT/diag.json"
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_rotate_attend.py -k "8b_heads or (test_cuda and bfloat16)"
budget_step engine_fp8 65 python3 benchmarks/decode_throughput.py $ENGINE --quantization fp8 \
  --no-dot-configs --output "$OUT/engine_fp8.json"
budget_step engine_bf16 50 python3 benchmarks/decode_throughput.py $ENGINE --profile \
  --profile-variants default PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1 --output "$OUT/engine_bf16.json"
cat "$OUT/steps"
grep -E "^rows " "$OUT/diag.log" 2>/dev/null
for f in "$OUT"/engine_*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('variants') or [(r['batch'], round(r['step_ms'], 4), \
round(r['fraction_of_floor'], 3)) for r in d['rows']])" "$f"
done
exit 0
