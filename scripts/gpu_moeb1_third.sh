#!/usr/bin/env bash
# Issue 61 item 2 (helper moeb1, session 45), third call (~150 s, ONE H200): the small path's
# two kernels with the next K step's weight tiles loaded before this step's sums
# (PARASHIFT_MOE_SMALL_PIPELINE=1): the engine A/B at b1 first (graph variant, 3 rounds), then
# benchmarks/moe_chain.py at one token, then the GPU test of the same bits at the model's shape.
# Usage: OUT=dir [BUDGET_S=145] bash scripts/gpu_moeb1_third.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-145}
MOE=benchmarks/shapes/qwen3-30b-a3b.json
source scripts/budget_step.sh
budget_step engine 70 python3 benchmarks/decode_throughput.py --model "$MOE" \
  --max-model-len 8192 --context 1024 --decode-steps 32 --cuda-graphs --batch-sizes 1 \
  --graph-variants PARASHIFT_MOE_SMALL_PIPELINE=1 --rounds 3 --output "$OUT/engine.json"
budget_step moe_chain 35 python3 benchmarks/moe_chain.py --model "$MOE" --tokens 1 \
  --layers 16 --output "$OUT/moe_chain.json"
budget_step tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  "tests/kernels/test_moe_small.py::test_one_launch_at_the_model_shape_in_a_graph[1]"
tail -n 2 "$OUT/engine.log" "$OUT/moe_chain.log" | cut -c1-2500
