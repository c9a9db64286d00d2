#!/usr/bin/env bash
# Issue 61: prefill on one H200 (8B shape) before and after a change, in one call. This tree
# against the one in $BEFORE, interleaved ROUNDS times (default 2; even rounds run this tree
# first), each tree running its own benchmarks/prefill_throughput.py.
# JSON to $OUT/prefill_<tree>_<round>.json.
# Usage: OUT=dir BEFORE=.before [ROUNDS=2] [LENS="4096 8192 16384 32768"] bash scripts/gpu_prefill_ab.sh
set -u
here=$(pwd); before=${BEFORE:?the earlier tree}
for round in $(seq "${ROUNDS:-2}"); do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"
  for tree in $order; do
    dir=$here; [ $tree = before ] && dir=$here/$before
    (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/prefill_throughput.py \
      --model "$here/benchmarks/shapes/llama-3.1-8b.json" --prompt-lens ${LENS:-4096 8192 16384 32768} \
      --repeats 3 --output "$OUT/prefill_${tree}_$round.json" 2>&1 \
      | grep -vE 'Warning|warn' | tail -5 | cut -c1-300 | sed "s/^/[$tree $round] /")
  done
done
