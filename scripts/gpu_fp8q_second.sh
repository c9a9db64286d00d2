#!/usr/bin/env bash
# Issue 60 (helper fp8q), second call on one H200: the step ceiling (benchmarks/step_ceiling.py)
# beside the engine's step, 8B FP8 and then bf16 at 1 and 64 rows (one engine each, context
# 1024, 3 rounds), each engine's step also with PDL off, whose profile gives every kernel's
# own time (the first call's profile had PDL's overlap in each kernel's span); the ceiling
# also without the kernels that read no weight or KV (reads_only_ms). BUDGET_S (120).
# Usage (repository root): OUT=dir [BUDGET_S=120] bash scripts/gpu_fp8q_second.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-120}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
OFF=PARASHIFT_PDL=0
budget_step fp8 50 python3 benchmarks/step_ceiling.py --model $EIGHT_B --quantization fp8 \
  --no-dot-configs --batch-sizes 1 64 --rounds 3 --graph-variants $OFF --profile-variants $OFF \
  --output "$OUT/fp8.json"
budget_step bf16 45 python3 benchmarks/step_ceiling.py --model $EIGHT_B --batch-sizes 1 64 \
  --rounds 3 --graph-variants $OFF --profile-variants $OFF --output "$OUT/bf16.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/fp8.log "$OUT"/bf16.log 2>/dev/null | cut -c1-2500
