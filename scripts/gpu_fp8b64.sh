#!/usr/bin/env bash
# Issue 60 (session 48, helper fp8b64), for the next session's call on ONE H200, in priority
# order (BUDGET_S, 150 by default on a warm machine; the last steps are skipped first):
# 1. GPU tests (~40 s): SiLU·mul in FP8 gate_up's TMA epilogue gives the bits of the dispatch's
#    GEMM then SiLU·mul FP8 at 1-64 rows (every tiling, down's rows by quantize_rows or by
#    parts; the 8B's gate_up), and an engine's greedy tokens at 20 sequences with it forced
#    equal to those without, and the same bits with PDL off, early and late;
# 2. the FP8 GEMM candidates compiled in 15 processes (~25 s; else the engine compiles them);
# 3. the engine A/B (~45 s): decode_throughput 8B FP8 b1 and b64 (context 1024), default
#    (PARASHIFT_FP8_GATE_UP_SILU=0) against =1 (graph variants, 2 rounds in turn) in one engine;
#    its log's JSON names what the choices took (fp8_gated: the fused tiling or "unfused");
# 4. the kernel A/B (~15 s): benchmarks/fp8_gated_ab.py, 8B gate_up at 16/32/64 rows, the pair
#    against every fused tiling (fp8q's benchmark kernel: 34.24 + 3.55 against 33.39 + 6.66 µs
#    at 64 rows);
# 5. the choice's steadiness (~25 s): benchmarks/choice_steadiness.py, the 8B's four FP8
#    projections at 1 and 64 rows timed 4 times as a start times them, the old rule's pick
#    (the fastest) and steady_choice's from each timing, and their flips;
# 6. with BUDGET_S=190: two more engine starts at b1 (~20 s each): with step 3's, the b1 step
#    and gate_up's one-row choice over three starts.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_fp8b64.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
B1_START="--model $EIGHT_B --quantization fp8 --no-dot-configs --context 1024 --decode-steps 32"
budget_step gpu_tests 40 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gated_tma.py tests/layers/test_fp8_gated_silu.py \
  tests/kernels/test_pdl.py::test_the_gated_gate_up_gives_the_same_bits_with_pdl
budget_step warm 25 python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 15
budget_step decode 45 python3 benchmarks/decode_throughput.py $B1_START --batch-sizes 1 64 \
  --cuda-graphs --rounds 2 --graph-variants PARASHIFT_FP8_GATE_UP_SILU=1 \
  --output "$OUT/decode.json"
budget_step kernel_ab 15 python3 benchmarks/fp8_gated_ab.py --rows 16 32 64 --rounds 3 \
  --output "$OUT/kernel_ab.json"
budget_step steadiness 25 python3 benchmarks/choice_steadiness.py --rows 1 64 --repeats 4 \
  --output "$OUT/steadiness.json"
for start in 2 3; do
  budget_step start$start 20 python3 benchmarks/decode_throughput.py $B1_START --batch-sizes 1 \
    --cuda-graphs --output "$OUT/start$start.json"
done
cat "$OUT/steps"
grep -h '^{' "$OUT"/kernel_ab.log "$OUT"/steadiness.log 2>/dev/null | cut -c1-1500
for f in "$OUT"/decode.json "$OUT"/start*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('variants') or [(r['batch'], round(r['step_ms'], 4), \
round(r['fraction_of_floor'], 3)) for r in d['rows']], d['fp8_gated'], \
[c for c in d['fp8_gemm'] if c['rows_up_to'] == 1 and c['weight'][0] == 28672])" "$f"
done
