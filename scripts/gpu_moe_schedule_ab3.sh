#!/usr/bin/env bash
# Issue 61 (item 2), a short third call: Qwen3-30B-A3B at 4,096 tokens, one engine, the tree
# (default) against the tree before (session 42's tiles without flags, the Triton attention:
# bN_cudnn_off) and against session 42's tiles with cuDNN (oN: the attention fix alone),
# interleaved three times with the tree again (tN) so that a drift of the host shows; then the
# GPU tests the second call's 60 s cut (the schedule flags, FP8 under the flags, the engine's
# greedy tokens); then prefill_throughput.py's own run where time is left.
# Usage: OUT=dir bash scripts/gpu_moe_schedule_ab3.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
S=benchmarks/shapes/qwen3-30b-a3b.json
mkdir -p "$OUT"
B=$OUT/tiles_before.json T=$OUT/tiles_table.json
echo '{"block_m": 128, "gate_up": [64, 64, 4, 3], "down": [256, 64, 8, 3]}' > "$B"
echo '{"block_m": 128, "gate_up": [128, 64, 8, 4], "down": [256, 64, 8, 4], "n_first": 1, "split_tail": 1}' > "$T"
start=$SECONDS
timeout 55 python3 benchmarks/prefill_variants.py --model "$S" --prompt-lens 4096 --repeats 5 \
  --variants default --tile-files b1_cudnn_off="$B" o1="$B" t1="$T" b2_cudnn_off="$B" \
  o2="$B" t2="$T" b3_cudnn_off="$B" o3="$B" t3="$T" \
  --output "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[prefill_variants rc=$? $((SECONDS - start)) s]"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
PARASHIFT_TEST_DEVICE=cuda timeout 28 python3 -m pytest -q -p no:cacheprovider $xdist \
  -k "schedules or fp8_experts_under or keep_the_tokens" tests/kernels/test_moe_prefill.py \
  tests/engine/test_gpu_moe_prefill.py > "$OUT/gpu_tests.log" 2>&1
echo "[gpu_tests rc=$?] $(tail -1 "$OUT/gpu_tests.log")"
[ $SECONDS -lt 60 ] && timeout 25 python3 benchmarks/prefill_throughput.py --model "$S" \
  --prompt-lens 4096 --repeats 3 --output "$OUT/prefill_throughput.json" \
  > "$OUT/prefill_throughput.log" 2>&1; tail -1 "$OUT/prefill_throughput.log"
python3 benchmarks/moe_schedule_summary.py "$OUT" | tee "$OUT/summary.txt"
