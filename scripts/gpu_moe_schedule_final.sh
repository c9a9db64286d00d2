#!/usr/bin/env bash
# Issue 61 (item 2): the MoE prefill table's row with its schedule flags (moe_prefill.TILES)
# against the row before (tiles_before.json: the session-42 tiles, no flags), one engine,
# Qwen3-30B-A3B at 512 and 4,096 tokens, in the order table, before, table (the first
# profiled); in the background while its engine starts: the GPU tests of the MoE prefill path
# and the engine's greedy tokens with the flags (stopped after 60 s, before the timed steps).
# Usage: OUT=dir bash scripts/gpu_moe_schedule_final.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
S=benchmarks/shapes/qwen3-30b-a3b.json
mkdir -p "$OUT"
echo '{"block_m": 128, "gate_up": [64, 64, 4, 3], "down": [256, 64, 8, 3]}' \
  > "$OUT/tiles_before.json"
python3 -c "import json, torch; from parashift.kernels import moe_prefill as m; \
print(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in \
m.TILES[torch.cuda.get_device_name()].items()}))" > "$OUT/tiles_table.json"
cat "$OUT/tiles_table.json"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
(PARASHIFT_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider $xdist \
  -k "not interpreted" tests/kernels/test_moe_prefill.py tests/engine/test_gpu_moe_prefill.py \
  > "$OUT/gpu_tests.log" 2>&1; echo "[gpu_tests rc=$?]" >> "$OUT/gpu_tests.log") &
start=$SECONDS
timeout 90 python3 benchmarks/prefill_variants.py --model "$S" --prompt-lens 512 4096 \
  --repeats 3 --variants default --profile --variant-lens 512 4096 \
  --tile-files before="$OUT/tiles_before.json" table="$OUT/tiles_table.json" \
  --output "$OUT/variants.json" > "$OUT/variants.log" 2>&1
echo "[prefill_variants rc=$? $((SECONDS - start)) s]"
wait
tail -3 "$OUT/gpu_tests.log"
python3 benchmarks/moe_schedule_summary.py "$OUT" | tee "$OUT/summary.txt"
