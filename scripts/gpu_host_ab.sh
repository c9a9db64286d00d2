#!/usr/bin/env bash
# Issue 24: host work per decode step through the engine core's loop (--output-processor
# core, streamed outputs), this tree against the one in $BEFORE, interleaved, ROUNDS times
# (default 2; even rounds run this tree first), JSON to $OUT. Both trees run this tree's
# benchmarks/host_overhead.py.
# FRONTEND=process makes the outputs in a child process (host_overhead.py --frontend), as
# engine_core_process does; the default makes them on the loop's thread between steps.
# Usage: OUT=dir BEFORE=.before TOKENIZER=.tok [ROUNDS=2] [BATCHES="256 1024"] \
#   [FRONTEND=here|process] bash scripts/gpu_host_ab.sh (1,024 sequences of context 512
#   need an H200)
set -u
here=$(pwd); before=${BEFORE:?the earlier tree}; tok=${TOKENIZER:?a tokenizer directory}
for round in $(seq "${ROUNDS:-2}"); do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"  # no tree always second
  for tree in $order; do
    dir=$here; [ $tree = before ] && dir=$here/$before
    (cd "$dir" && PYTHONPATH="$dir" python3 "$here/benchmarks/host_overhead.py" \
      --model "$here/benchmarks/shapes/llama-3.1-8b.json" --batch-sizes ${BATCHES:-256 1024} \
      --context 512 --decode-steps 40 --tokenizer "$here/$tok" --output-processor core \
      --output-kind delta --frontend "${FRONTEND:-here}" \
      --output "$OUT/host_${tree}_${FRONTEND:-here}_$round.json" 2>&1 \
      | grep -E '^\{|Error' | cut -c1-400 | sed "s/^/[$tree ${FRONTEND:-here} $round] /")
  done
done
