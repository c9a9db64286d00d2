#!/usr/bin/env bash
# Issue 58's constraint: decode b1, b64 and b256 on one H200 (8B shape) before and after a
# change, in one call. This tree against the one in $BEFORE, interleaved ROUNDS times (default
# 3; even rounds run this tree first), each tree running its own benchmarks/decode_throughput.py.
# JSON to $OUT/decode_<tree>_<round>.json.
# Usage: OUT=dir BEFORE=.before [ROUNDS=3] [BATCHES="1 64 256"] bash scripts/gpu_decode_ab.sh
set -u
here=$(pwd); before=${BEFORE:?the earlier tree}
for round in $(seq "${ROUNDS:-3}"); do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"  # no tree always second
  for tree in $order; do
    dir=$here; [ $tree = before ] && dir=$here/$before
    (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/decode_throughput.py \
      --model "$here/benchmarks/shapes/llama-3.1-8b.json" --batch-sizes ${BATCHES:-1 64 256} \
      --context 1024 --decode-steps 32 --output "$OUT/decode_${tree}_$round.json" 2>&1 \
      | grep -vE 'Warning|warn' | tail -6 | cut -c1-300 | sed "s/^/[$tree $round] /")
  done
done
