#!/usr/bin/env bash
# Issue 61 item 2 (helper moeb1, session 45), third call (~150 s, ONE H200): the small path's
# two kernels with the next K step's weight tiles loaded before this step's sums
# (PARASHIFT_MOE_SMALL_PIPELINE=1) and the one-launch router in one warp a program
# (PARASHIFT_MOE_ROUTER_WARPS=1): the engine A/B at b1 first (graph variants, 3 rounds), then
# benchmarks/moe_router.py at one row (its tiles), benchmarks/moe_chain.py at one token, and the
# GPU tests of the same bits.
# Usage: OUT=dir [BUDGET_S=148] bash scripts/gpu_moeb1_third.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-148}
MOE=benchmarks/shapes/qwen3-30b-a3b.json
source scripts/budget_step.sh
budget_step engine 70 python3 benchmarks/decode_throughput.py --model "$MOE" \
  --max-model-len 8192 --context 1024 --decode-steps 32 --cuda-graphs --batch-sizes 1 \
  --graph-variants PARASHIFT_MOE_SMALL_PIPELINE=1 PARASHIFT_MOE_ROUTER_WARPS=1 --rounds 3 \
  --output "$OUT/engine.json"
budget_step moe_router 15 python3 benchmarks/moe_router.py --model "$MOE" --tokens 1 \
  --output "$OUT/moe_router.json"
budget_step moe_chain 35 python3 benchmarks/moe_chain.py --model "$MOE" --tokens 1 \
  --layers 16 --output "$OUT/moe_chain.json"
budget_step tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  "tests/kernels/test_moe_small.py::test_one_launch_at_the_model_shape_in_a_graph[1]" \
  tests/kernels/test_moe_router.py -k "(cuda and bfloat16) or one_launch_at"
tail -n 2 "$OUT/engine.log" "$OUT/moe_router.log" "$OUT/moe_chain.log" | cut -c1-2500
