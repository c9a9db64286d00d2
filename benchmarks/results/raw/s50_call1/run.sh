#!/usr/bin/env bash
# Session 50's first call (x2): lane 0 the FP8 b64 step today with the one-launch RoPE fold as a
# graph variant (3 rounds); lane 1 helper bgated's script (scripts/gpu_bgated.sh).
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=.:/tmp/site python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 28 > $OUT/warm.log 2>&1
( export CUDA_VISIBLE_DEVICES=0; cd . && PYTHONPATH=.:/tmp/site timeout 330 taskset -c 0-13 python3 benchmarks/decode_throughput.py \
    --model benchmarks/shapes/llama-3.1-8b.json --quantization fp8 --no-dot-configs --batch-sizes 64 \
    --context 1024 --decode-steps 32 --cuda-graphs --rounds 3 \
    --graph-variants PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1 --output $OUT/fp8_b64.json > $OUT/fp8_b64.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 NEED_SCALE=2; OUT=$OUT/bgated BUDGET_S=300 taskset -c 14-27 bash scripts/gpu_bgated.sh > $OUT/bgated.out 2>&1 ) &
wait
tail -n 5 $OUT/fp8_b64.log | cut -c1-600
tail -n 30 $OUT/bgated.out | cut -c1-600
