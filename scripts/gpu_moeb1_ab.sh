#!/usr/bin/env bash
# Issue 61 item 2 (helper moeb1, session 45): Qwen3-30B-A3B decode at one row, the MoE block
# in fewer launches, on ONE H200, in this order (what BUDGET_S leaves out last):
# 1. the engine at b1 (context 1024, graphs, max-model-len 8192, 32 steps): default,
#    PARASHIFT_MOE_SMALL_DOWN_AHEAD=1 (the down kernel's first reads before its PDL wait),
#    PARASHIFT_MOE_SMALL_ONE=router (router and experts in one launch) and PARASHIFT_PDL=0 as
#    graph variants, 3 rounds, kernel profiles of default and PDL off;
# 2. benchmarks/moe_chain.py at one token: 16 MoE layers in a CUDA graph with PDL: the two
#    launches' tiles, the down kernel ahead, one launch and its tiles, router + experts in one
#    launch (routed by the last router program or by each tile; with a pause between polls);
# 3. GPU tests: one launch and the down kernel ahead give the two launches' bits (bf16 cases,
#    the model's shape in a graph), the router and experts in one launch through FusedMoE.
# Usage: OUT=dir [BUDGET_S=235] bash scripts/gpu_moeb1_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-235}
MOE=benchmarks/shapes/qwen3-30b-a3b.json
T=tests/kernels/test_moe_small.py
source scripts/budget_step.sh
budget_step engine 100 python3 benchmarks/decode_throughput.py --model "$MOE" \
  --max-model-len 8192 --context 1024 --decode-steps 32 --cuda-graphs --batch-sizes 1 \
  --graph-variants PARASHIFT_MOE_SMALL_DOWN_AHEAD=1 PARASHIFT_MOE_SMALL_ONE=router \
  PARASHIFT_PDL=0 --rounds 3 --profile --profile-variants default PARASHIFT_PDL=0 \
  --output "$OUT/engine.json"
budget_step moe_chain 50 python3 benchmarks/moe_chain.py --model "$MOE" --tokens 1 \
  --layers 16 --output "$OUT/moe_chain.json"
budget_step tests 45 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  "$T::test_one_launch_at_the_model_shape_in_a_graph" \
  tests/layers/test_fused_moe.py::test_router_and_experts_in_one_launch_give_the_same_bits \
  "$T::test_cuda[tokens=1-experts=128-top_k=8-hidden=64-inter=48-tiles=0-bfloat16]" \
  "$T::test_cuda[tokens=2-experts=8-top_k=8-hidden=64-inter=32-held=4-first=2-crowd=True-tiles=0-bfloat16]"
tail -n 2 "$OUT/engine.log" "$OUT/moe_chain.log" | cut -c1-3000
