#!/usr/bin/env bash
# Helper fp8s's GPU calls (issue 60: 8B FP8 decode at one row). One H200. Steps, each under
# budget_step (skipped where it would pass $BUDGET_S, stopped at twice its need):
#   timeline_fp8: benchmarks/decode_step_timeline.py, 8B FP8 b1 (context 1024, graphs for 2048):
#     decode_throughput's step_ms, the steady pace, the step's parts by CUDA events, the graph
#     replayed alone, a host profile; the default against graph variants ($VARIANTS), $ROUNDS
#     rounds interleaved, in one engine
#   tests_attention, tests_engine: the GPU tests of the change
#   timeline_bf16, timeline_moe (Qwen3-30B-A3B): the default against $BEFORE where the budget is left
#   CALL=3: bf16 and Qwen3-30B-A3B b1 (default against $BEFORE) and the engine's token tests only
#   CALL=4: FP8 b1 default against the RMSNorm's and the split reduction's warps (patch variants)
# Usage: OUT=dir [BUDGET_S=195] [ROUNDS=3] [CALL=3] bash scripts/gpu_fp8s.sh
set -u
: "${OUT:?a folder for the results}"
budget=${BUDGET_S:-195}
rounds=${ROUNDS:-3}
BEFORE=PARASHIFT_ATTN_SPLIT_TOKENS=128,PARASHIFT_ATTN_NEW_FIRST=0,PARASHIFT_ATTN_REDUCE_EARLY=0
VARIANTS=${VARIANTS:-PARASHIFT_ATTN_NEW_FIRST=0 PARASHIFT_ATTN_REDUCE_EARLY=0 $BEFORE}
S=benchmarks/shapes
source scripts/budget_step.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpus.txt" 2>&1
timeline() {  # timeline NAME NEED MODEL VARIANTS [ARGS...]
  local name=$1 need=$2 model=$3 variants=$4; shift 4
  local graph_variants=(); [ -n "$variants" ] && graph_variants=(--graph-variants $variants)
  budget_step "timeline_$name" "$need" python3 benchmarks/decode_step_timeline.py \
    --model "$S/$model.json" --batch-sizes 1 --context 1024 --rounds "$rounds" \
    --no-mixed-graphs --no-dot-configs ${graph_variants[@]+"${graph_variants[@]}"} \
    --host-profile "$OUT/host_profile_$name" --output "$OUT/timeline_$name.json" "$@"
}
gputests() {  # gputests NAME NEED PYTEST-ARGS...
  local name=$1 need=$2; shift 2
  budget_step "tests_$name" "$need" env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
    -p no:cacheprovider "$@"
}
T=tests/attention/test_triton_backend.py
P=tests/kernels/test_pdl.py
if [ "${CALL:-2}" = 4 ]; then  # fourth call: the norm's and the reduction's warps at one row
  timeline fp8_patches 100 llama-3.1-8b "" --quantization fp8 --patch-variants norm_warps_1 \
    norm_warps_2 norm_warps_4 norm_warps_16 reduce_warps_1 reduce_warps_2 reduce_warps_8
elif [ "${CALL:-2}" = 3 ]; then  # third call: bf16, the engine's tokens, the MoE
  timeline bf16 45 llama-3.1-8b "$BEFORE"
  gputests engine 60 tests/engine/test_gpu_engine.py::test_graphs_and_async_scheduling_give_the_eager_tokens \
    $P::test_engine_tokens_and_logprobs_are_the_same_with_pdl
  timeline moe 50 qwen3-30b-a3b "$BEFORE"
else
  timeline fp8 80 llama-3.1-8b "$VARIANTS" --quantization fp8
  gputests attention 50 tests/attention/test_decode_splits.py tests/attention/test_rotate_attend.py \
    $T::test_decode_in_a_graph_for_a_longer_context $T::test_decode_right_after_a_pdl_kv_write \
    $P::test_rotary_and_attention_give_the_same_bits_with_pdl \
    $P::test_a_graph_of_a_decode_chain_gives_the_same_bits_with_pdl
  gputests engine 40 tests/engine/test_gpu_engine.py -k "graphs_and_async or lone_sequences"
  timeline bf16 40 llama-3.1-8b "$BEFORE"
  timeline moe 50 qwen3-30b-a3b "$BEFORE"
fi
echo "used $SECONDS s"
