#!/usr/bin/env bash
# Issue 60 (helper fp8q): the step ceiling (benchmarks/step_ceiling.py: a whole decode step of
# read-only kernels launched as the engine launches its kernels, one CUDA graph, PDL) beside the
# engine's step and its kernels in launch order, 8B FP8 and bf16 at 1 and 64 rows, one engine
# each (decode graphs for those two batches only); FP8's step also under PDL late and a 128 KB
# prefetch of the TMA GEMM; benchmarks/fp8_tma_anatomy.py (the 64-row TMA GEMM's tilings taken
# apart: weight by TMA alone, with the tokens' tiles, with wgmma, the engine's kernel, the
# read-only ceiling). BUDGET_S (150) skips the last steps first.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_fp8q.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
budget_step fp8 85 python3 benchmarks/step_ceiling.py --model $EIGHT_B --quantization fp8 \
  --no-dot-configs --batch-sizes 1 64 --rounds 2 --output "$OUT/fp8.json" \
  --graph-variants PARASHIFT_PDL=late PARASHIFT_FP8_TMA_PREFETCH_KB=128
budget_step anatomy 35 python3 benchmarks/fp8_tma_anatomy.py --output "$OUT/anatomy.json"
budget_step bf16 45 python3 benchmarks/step_ceiling.py --model $EIGHT_B \
  --batch-sizes 1 64 --rounds 2 --output "$OUT/bf16.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/fp8.log "$OUT"/anatomy.log "$OUT"/bf16.log 2>/dev/null | cut -c1-1500
