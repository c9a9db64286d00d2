#!/usr/bin/env bash
# Issue 60 (helper fp8q), first call on one H200, in priority order (BUDGET_S, 150 by default,
# skips the last steps first). As run at e52c681: the stream-K kernel, its tests, its sweep
# option and its switch were removed after this call (slower everywhere; docs/benchmark_log.md),
# so steps 1-2 and the STREAMK variants no longer run on the tree as it is now:
# 1. GPU tests of the stream-K FP8 GEMM (kernels/fp8_gemm_streamk.py);
# 2. benchmarks/fp8_gemm_sweep.py at 64 rows, x in E4M3, in the decode chain: the registered TMA
#    configs against the stream-K ones (--kernels sk);
# 3. the step ceiling (benchmarks/step_ceiling.py: a whole decode step of read-only kernels
#    launched as the engine launches its kernels, one CUDA graph, PDL) beside the engine's step
#    and its kernels in launch order, 8B FP8 at 1 and 64 rows in one engine (decode graphs for
#    those two batches only), the engine's step also under PDL late, a 128 KB TMA prefetch and
#    the stream-K kernel on the chosen tiles (PARASHIFT_FP8_STREAMK=1) or on 256x128 w8 s4;
# 4. benchmarks/fp8_tma_anatomy.py: the 64-row TMA GEMM's tilings taken apart;
# 5. the step ceiling for bf16.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_fp8q.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemm_streamk.py
budget_step sweep 40 python3 benchmarks/fp8_gemm_sweep.py --rows 64 --kernels sk --x-fp8 --chain \
  --workers 15 --output "$OUT/sweep.json"
budget_step fp8 85 python3 benchmarks/step_ceiling.py --model $EIGHT_B --quantization fp8 \
  --no-dot-configs --batch-sizes 1 64 --rounds 2 --output "$OUT/fp8.json" \
  --graph-variants PARASHIFT_PDL=late PARASHIFT_FP8_TMA_PREFETCH_KB=128 PARASHIFT_FP8_STREAMK=1 \
  PARASHIFT_FP8_STREAMK=256x128x8x4
budget_step anatomy 35 python3 benchmarks/fp8_tma_anatomy.py --output "$OUT/anatomy.json"
budget_step bf16 45 python3 benchmarks/step_ceiling.py --model $EIGHT_B \
  --batch-sizes 1 64 --rounds 2 --output "$OUT/bf16.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/sweep.log | cut -c1-1200
grep -h '^{' "$OUT"/fp8.log "$OUT"/anatomy.log "$OUT"/bf16.log 2>/dev/null | cut -c1-1500
