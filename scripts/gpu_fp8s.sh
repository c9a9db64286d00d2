#!/usr/bin/env bash
# Helper fp8s's GPU calls (issue 60: 8B FP8 decode at one row). One H200. Steps, each under
# budget_step (skipped where it would pass $BUDGET_S, stopped at twice its need):
#   timeline_fp8: benchmarks/decode_step_timeline.py, 8B FP8 b1 (context 1024, graphs for 2048):
#     decode_throughput's step_ms, the steady pace, the step's parts by CUDA events, the graph
#     replayed alone, a host profile; graph variants $VARIANTS, $ROUNDS rounds interleaved
#   tests: the GPU tests of the change ($TESTS)
#   timeline_bf16: the same for bf16 (where the budget is left)
# Usage: OUT=dir [BUDGET_S=195] [ROUNDS=3] [VARIANTS="..."] bash scripts/gpu_fp8s.sh
set -u
: "${OUT:?a folder for the results}"
budget=${BUDGET_S:-195}
rounds=${ROUNDS:-3}
variants=${VARIANTS:-PARASHIFT_ATTN_SPLIT_TOKENS=128}
tests=${TESTS:-tests/attention/test_decode_splits.py tests/attention/test_rotate_attend.py}
S=benchmarks/shapes
source scripts/budget_step.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpus.txt" 2>&1
timeline() {  # timeline NAME NEED [ARGS...]
  local name=$1 need=$2; shift 2
  budget_step "timeline_$name" "$need" python3 benchmarks/decode_step_timeline.py \
    --model "$S/llama-3.1-8b.json" --batch-sizes 1 --context 1024 --rounds "$rounds" \
    --no-mixed-graphs --no-dot-configs --graph-variants $variants \
    --host-profile "$OUT/host_profile_$name" --output "$OUT/timeline_$name.json" "$@"
}
timeline fp8 75 --quantization fp8
budget_step tests 40 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  $tests tests/attention/test_triton_backend.py -k "longer_context or pdl_kv_write or lone or \
graphs_and_async or split"
timeline bf16 45
echo "used $SECONDS s"
