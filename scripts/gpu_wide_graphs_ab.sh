#!/usr/bin/env bash
# Issue 59: offline `chat` (600 requests, the 8B shape, no tokenizer) at the default mixed
# graphs against the wide mixed buckets (PARASHIFT_MIXED_GRAPH_WIDE_SEQS=$WIDE, default
# 256) on this tree: TP=2 at the default and wide on both GPUs, then the two one-GPU runs
# side by side (GPU 0 default, GPU 1 wide); each run's start-up line (its graph capture
# seconds, where the engine logs it). JSON and logs to $OUT; ~150 s on two H200s, each run
# under $LIMIT s (default 75).
# Usage: OUT=dir [WIDE=256] bash scripts/gpu_wide_graphs_ab.sh
set -u
mkdir -p "$OUT"; export PYTHONPATH=. PYTHONUNBUFFERED=1
run() {  # name, wide sequences (0: default), GPUs, flags...
  local name=$1 wide=$2 gpus=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpus PARASHIFT_MIXED_GRAPH_WIDE_SEQS=$wide timeout -k 5 "${LIMIT:-75}" \
    python3 -m parashift.bench throughput --workload chat --num-requests 600 \
    --model benchmarks/shapes/llama-3.1-8b.json --dtype bfloat16 --max-model-len 8192 "$@" \
    --output-json "$OUT/chat_$name.json" > "$OUT/chat_$name.log" 2>&1
  echo "[$name] exit $? $(grep -E '^chat: ' "$OUT/chat_$name.log" | cut -c1-200)"
  grep -oE "rank [0-9]+ start-up [0-9.]+ s|CUDA graphs [0-9.]+ s" "$OUT/chat_$name.log" \
    | paste -sd' ' | sed "s/^/[$name] /"
}
run tp2_default 0 0,1 -tp 2
run tp2_wide "${WIDE:-256}" 0,1 -tp 2
run single_default 0 0 & run single_wide "${WIDE:-256}" 1 & wait
