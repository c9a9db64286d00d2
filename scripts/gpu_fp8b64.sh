#!/usr/bin/env bash
# Issue 60 (session 48, helper fp8b64), for the next session's call on ONE H200, in priority
# order (BUDGET_S, 150 by default on a warm machine; the last steps are skipped first):
# 1. GPU tests: SiLU·mul in FP8 gate_up's TMA epilogue gives the bits of the dispatch's GEMM then
#    SiLU·mul FP8 at 1-64 rows (every tiling; the 8B's gate_up), an engine's greedy tokens at 20
#    sequences with it forced equal to those without, and the choice rule (CPU tests alike);
# 2. the FP8 GEMM candidates compiled in 15 processes (a cold Triton cache otherwise costs the
#    engine's start-up ~60 s);
# 3. the kernel A/B: benchmarks/fp8_gated_ab.py, 8B gate_up at 16/32/64 rows, the pair against
#    every fused tiling (fp8q's benchmark kernel: 34.24 + 3.55 against 33.39 + 6.66 µs at 64);
# 4. the engine A/B: decode_throughput 8B FP8 b1 and b64 (context 1024), default (switch off)
#    against PARASHIFT_FP8_GATE_UP_SILU=1 (graph variants, 2 rounds in turn) in one engine;
# 5. two more fresh engine starts at b1: with step 4's, the b1 step and the GEMM choices over
#    three starts (the steady choice: gate_up's GEMV should not flip between them).
# Seconds (estimated, warm machine): 25 + 25 + 20 + 45 + 2 x 20 = 155; BUDGET_S skips the last.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_fp8b64.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
SWITCH=PARASHIFT_FP8_GATE_UP_SILU
budget_step gpu_tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gated_tma.py tests/layers/test_fp8_gated_silu.py \
  tests/kernels/test_gemm_timing.py
budget_step warm 25 python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 15
budget_step kernel_ab 20 python3 benchmarks/fp8_gated_ab.py --rows 16 32 64 --rounds 3 \
  --output "$OUT/kernel_ab.json"
budget_step decode 45 python3 benchmarks/decode_throughput.py --model $EIGHT_B --quantization fp8 \
  --no-dot-configs --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 2 \
  --graph-variants $SWITCH=1 --output "$OUT/decode.json"
for start in 2 3; do
  budget_step start$start 20 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
    --quantization fp8 --no-dot-configs --batch-sizes 1 --context 1024 --decode-steps 32 \
    --cuda-graphs --output "$OUT/start$start.json"
done
cat "$OUT/steps"
grep -h '^{' "$OUT"/kernel_ab.log | cut -c1-1500
grep -h '"variants"' -A12 "$OUT"/decode.log | head -16
grep -h "gate_up's epilogue\|FP8 GEMM, 1 rows x (28672" "$OUT"/decode.log "$OUT"/start*.log \
  | cut -c1-300
for f in "$OUT"/decode.json "$OUT"/start*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], [(r['batch'], r.get('variant'), round(r['step_ms'], 4)) for r in d['rows']], \
[c for c in d['fp8_gemm'] if c['rows_up_to'] == 1])" "$f"
done
