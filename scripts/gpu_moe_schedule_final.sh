#!/usr/bin/env bash
# (Helper moepf's call script as it ran but for step 3's cudnn_direct variant, dropped with
# PARASHIFT_CUDNN_DIRECT in session 51.)
# Issue 61 (item 2): Qwen3-30B-A3B prefill on ONE GPU, this tree (the MoE prefill table's row
# with its schedule flags, cuDNN's long-prompt attention reached again through the fused
# q/k-norm RoPE path) against what it replaces, in one call:
# 1. benchmarks/moe_prefill.py: one layer's experts swept again (with the joint gate_up), the
#    fastest to $OUT/tiles_best.json;
# 2. in the background while 3 starts its engine (stopped after 60 s): the GPU tests of the
#    MoE prefill path, the fused RoPE + attention path, cuDNN's prompt route and the engine's
#    greedy tokens with the flags;
# 3. benchmarks/prefill_variants.py, one engine, 512 and 4,096 tokens: the tree as it is
#    (profiled), cudnn_direct (PARASHIFT_CUDNN_DIRECT=1), before_cudnn_off (session 42's tiles without flags, the Triton attention: the
#    tree before), cudnn_off, before (session 42's tiles), best (the sweep's), nstj (the
#    table's tiles with tma and joint), table (the tree again, last);
# 4. benchmarks/prefill_throughput.py's own run (512 and 4,096, --repeats 3) where time is left.
# Usage: OUT=dir bash scripts/gpu_moe_schedule_final.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
S=benchmarks/shapes/qwen3-30b-a3b.json
mkdir -p "$OUT"
echo '{"block_m": 128, "gate_up": [64, 64, 4, 3], "down": [256, 64, 8, 3]}' \
  > "$OUT/tiles_before.json"
echo '{"block_m": 128, "gate_up": [128, 64, 8, 4], "down": [256, 64, 8, 4], "n_first": 1, "split_tail": 1}' \
  > "$OUT/tiles_table.json"
echo '{"block_m": 128, "gate_up": [128, 64, 8, 4], "down": [256, 64, 8, 4], "n_first": 1, "split_tail": 1, "tma": 1, "joint": 1}' \
  > "$OUT/tiles_nstj.json"
start=$SECONDS
timeout 50 python3 benchmarks/moe_prefill.py --model "$S" --tokens 4096 --jobs 14 \
  --output "$OUT/moe_prefill.json" --tiles-out "$OUT/tiles_best.json" > "$OUT/moe_prefill.log" 2>&1
echo "[moe_prefill rc=$? $((SECONDS - start)) s]"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
(PARASHIFT_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider $xdist \
  -k "not interpreted" tests/kernels/test_moe_prefill.py tests/engine/test_gpu_moe_prefill.py \
  tests/attention/test_rotate_attend.py tests/attention/test_cudnn_prefill.py \
  > "$OUT/gpu_tests.log" 2>&1; echo "[gpu_tests rc=$?]" >> "$OUT/gpu_tests.log") &
files="before_cudnn_off=$OUT/tiles_before.json cudnn_off=$OUT/tiles_table.json"
files="$files before=$OUT/tiles_before.json"
[ -s "$OUT/tiles_best.json" ] && files="$files best=$OUT/tiles_best.json"
files="$files nstj=$OUT/tiles_nstj.json table=$OUT/tiles_table.json"
start=$SECONDS
timeout 80 python3 benchmarks/prefill_variants.py --model "$S" --prompt-lens 512 4096 \
  --repeats 3 --variants default --profile --tile-files $files \
  --output "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[prefill_variants rc=$? $((SECONDS - start)) s]"
wait
tail -3 "$OUT/gpu_tests.log"
[ $SECONDS -lt 110 ] && timeout 35 python3 benchmarks/prefill_throughput.py --model "$S" \
  --prompt-lens 512 4096 --repeats 3 --output "$OUT/prefill_throughput.json" \
  > "$OUT/prefill_throughput.log" 2>&1; tail -2 "$OUT/prefill_throughput.log"
python3 benchmarks/moe_schedule_summary.py "$OUT" | tee "$OUT/summary.txt"
