#!/usr/bin/env bash
# Issue 59: offline `chat` (600 requests, the 8B shape, no tokenizer) at the default mixed
# graphs against the wide mixed buckets (PARASHIFT_MIXED_GRAPH_WIDE_SEQS=$WIDE, default
# 256) on this tree: TP=2 at the default and wide on both GPUs, then, where $BUDGET (default
# 115 s) leaves 50 s, the two one-GPU runs side by side (GPU 0 default, GPU 1 wide). Each
# run prints its result and start-up line (graph capture seconds). On one GPU, the one-GPU
# pair in turn instead. JSON, logs to $OUT.
# Usage: OUT=dir [WIDE=256] [BUDGET=115] bash scripts/gpu_wide_graphs_ab.sh
set -u
mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
budget=${BUDGET:-115}
left() { echo $(( budget - SECONDS )); }
run() {  # name, wide sequences (0: default), GPUs, seconds, flags...
  local name=$1 wide=$2 gpus=$3 limit=$4; shift 4
  CUDA_VISIBLE_DEVICES=$gpus PARASHIFT_MIXED_GRAPH_WIDE_SEQS=$wide timeout -k 3 "$limit" \
    python3 -m parashift.bench throughput --workload chat --num-requests 600 \
    --model benchmarks/shapes/llama-3.1-8b.json --dtype bfloat16 --max-model-len 8192 "$@" \
    --output-json "$OUT/chat_$name.json" > "$OUT/chat_$name.log" 2>&1
  echo "[$name] exit $? $(grep -E '^chat: ' "$OUT/chat_$name.log" | cut -c1-200)"
  grep -oE "rank [0-9]+ start-up [0-9.]+ s|CUDA graphs [0-9.]+ s" "$OUT/chat_$name.log" \
    | paste -sd' ' | sed "s/^/[$name] /"
}
if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then  # one GPU: the one-GPU pair in turn
  run single_default 0 0 $(( $(left) / 2 ))
  run single_wide "${WIDE:-256}" 0 "$(left)"
  exit 0
fi
run tp2_default 0 0,1 $(( $(left) - 35 )) -tp 2
run tp2_wide "${WIDE:-256}" 0,1 "$(left)" -tp 2
if [ "$(left)" -ge 50 ]; then
  run single_default 0 0 "$(left)" & run single_wide "${WIDE:-256}" 1 "$(left)" & wait
else
  echo "[single] not run: $(left) s of the budget left"
fi
