#!/usr/bin/env bash
# Issue 61 (item 2): Qwen3-30B-A3B prefill at 4,096 tokens on ONE GPU, the MoE prefill path's
# schedule flags (kernels/moe_schedule.py) against the table's tiles without them, in one call:
# 1. benchmarks/moe_prefill.py: one layer's experts, the tiles and schedules swept (kernels
#    compiled by $JOBS processes first), torch._grouped_mm beside; the fastest to
#    $OUT/tiles_best.json;
# 2. in the background while 3 starts its engine: the GPU tests of the MoE prefill path that
#    $TEST_FILTER picks (default: the schedule flags in bf16), stopped after 45 s so that they
#    do not overlap the timed steps;
# 3. benchmarks/prefill_variants.py, one engine: 512 and 4,096 tokens under the table's tiles
#    (profiled: the breakdown by kernel), then 4,096 under tiles files: the sweep's best, the
#    table's tiles with n_first, split_tail and tma (nst), without tma (ns), with joint too
#    (nstj); $EXTRA_TILES adds NAME=PATH pairs.
# Usage: OUT=dir [JOBS=14] [EXTRA_TILES="name=path ..."] bash scripts/gpu_moe_schedule_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
S=benchmarks/shapes/qwen3-30b-a3b.json
mkdir -p "$OUT"
tiles() {  # name, json
  echo "$2" > "$OUT/tiles_$1.json"
}
tiles nst '{"block_m": 128, "gate_up": [64, 64, 4, 3], "down": [256, 64, 8, 3], "n_first": 1, "split_tail": 1, "tma": 1}'
tiles ns '{"block_m": 128, "gate_up": [64, 64, 4, 3], "down": [256, 64, 8, 3], "n_first": 1, "split_tail": 1}'
tiles nstj '{"block_m": 128, "gate_up": [64, 64, 4, 3], "down": [256, 64, 8, 3], "n_first": 1, "split_tail": 1, "tma": 1, "joint": 1}'
start=$SECONDS
timeout 62 python3 benchmarks/moe_prefill.py --model "$S" --tokens 4096 --jobs "${JOBS:-14}" \
  --output "$OUT/moe_prefill.json" --tiles-out "$OUT/tiles_best.json" > "$OUT/moe_prefill.log" 2>&1
echo "[moe_prefill rc=$? $((SECONDS - start)) s]"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
(PARASHIFT_TEST_DEVICE=cuda timeout 45 python3 -m pytest -q -p no:cacheprovider $xdist \
  -k "${TEST_FILTER:-schedules and bfloat16}" tests/kernels/test_moe_prefill.py \
  > "$OUT/gpu_tests.log" 2>&1;
 echo "[gpu_tests rc=$?]" >> "$OUT/gpu_tests.log") &
files="nst=$OUT/tiles_nst.json ns=$OUT/tiles_ns.json nstj=$OUT/tiles_nstj.json ${EXTRA_TILES:-}"
[ -s "$OUT/tiles_best.json" ] && files="best=$OUT/tiles_best.json $files"
start=$SECONDS
timeout 80 python3 benchmarks/prefill_variants.py --model "$S" --prompt-lens 512 4096 \
  --repeats 3 --variants default --profile --python-profile --tile-files $files \
  --output "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[prefill_variants rc=$? $((SECONDS - start)) s]"
wait
tail -3 "$OUT/gpu_tests.log"
python3 benchmarks/moe_schedule_summary.py "$OUT" | tee "$OUT/summary.txt"
