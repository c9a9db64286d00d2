#!/usr/bin/env bash
# Session 49's last call (x2): lane 0 the one-launch RoPE fold (gpu_rope64b.sh), lane 1 the GPU
# tests of the session's cleanup and CI-time changes (gpu_cleanup49.sh, gpu_citime4.sh).
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=.:/tmp/site python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 28 > $OUT/warm.log 2>&1
( export CUDA_VISIBLE_DEVICES=0 NEED_SCALE=2; OUT=$OUT/rope64b BUDGET_S=${ROPE_S:-260} taskset -c 0-13 bash scripts/gpu_rope64b.sh > $OUT/rope64b.out 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 NEED_SCALE=2; OUT=$OUT/cleanup49 BUDGET_S=150 taskset -c 14-27 bash scripts/gpu_cleanup49.sh > $OUT/cleanup49.out 2>&1
  OUT=$OUT/citime4 BUDGET_S=200 taskset -c 14-27 bash scripts/gpu_citime4.sh > $OUT/citime4.out 2>&1 ) &
wait
tail -n 30 $OUT/*.out | cut -c1-400
