#!/usr/bin/env bash
# Issue 60 (helper fp8q), third call on one H200: the FP8 engine at 64 rows with its small
# kernels launched otherwise (decode_step_timeline.py's patch variants, graphs captured again):
# SiLU·mul with FP8 rows (the second call's largest small kernel, 5.6 µs a layer with PDL off)
# at other part widths, warps, or a program a row (the same bits, tested first); the RMSNorms'
# warps; beside its step ceiling. After it, fp8_tma_anatomy.py at gate_up: SiLU·mul inside
# gate_up's epilogue against the engine's SiLU·mul after it. BUDGET_S (88).
# Usage (repository root): OUT=dir [BUDGET_S=88] bash scripts/gpu_fp8q_third.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-88}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 15 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_silu_mul.py -k same_bits
budget_step fp8 55 python3 benchmarks/step_ceiling.py --model benchmarks/shapes/llama-3.1-8b.json \
  --quantization fp8 --no-dot-configs --batch-sizes 64 --rounds 2 --patch-variants \
  silu_fp8_block_1024 silu_fp8_block_4096 silu_fp8_warps_16 silu_fp8_rows norm_warps_4 \
  --output "$OUT/fp8.json"
budget_step anatomy 12 python3 benchmarks/fp8_tma_anatomy.py --projections gate_up \
  --output "$OUT/anatomy.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/anatomy.log "$OUT"/fp8.log 2>/dev/null | cut -c1-2500
