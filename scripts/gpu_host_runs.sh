#!/usr/bin/env bash
# Issue 24's one-GPU runs, JSON to $OUT: host work per decode step by part
# (benchmarks/host_overhead.py, with the SmolLM2 tokenizer in $TOKENIZER so detokenization is
# timed) and decode as a fraction of the floor, this tree against the one in $BEFORE (an
# earlier commit unpacked with `git archive REV | tar -x -C .before`), interleaved. Both
# trees run this tree's host_overhead.py (it skips parts an older tree lacks).
# PART=throughput instead: the `chat` and `batch` workloads' offline throughput (NUM requests,
# default 200), before and after.
# PART=core: this tree only, the engine core's loop (--output-processor core; the outputs made
# apart, as with --engine-core-process) against the output process, and the two workloads'
# throughput with and without --engine-core-process, detokenized.
# Usage: OUT=dir [BEFORE=.before] TOKENIZER=.tok [PART=throughput|core] \
#   bash scripts/gpu_host_runs.sh
set -u
model=benchmarks/shapes/llama-3.1-8b.json
here=$(pwd); tok=${TOKENIZER:?a tokenizer directory}
run_in() {  # run_in DIR LABEL COMMAND...
  local dir=$1 label=$2; shift 2
  (cd "$dir" && PYTHONPATH="$dir" "$@" 2>&1 | grep -E '^\{|Error|error' | tail -20 \
    | cut -c1-700 | sed "s/^/[$label] /")
}
if [ "${PART:-host}" = core ]; then
  for kind in delta final_only; do
    for processor in process core; do
      run_in . ${processor}_$kind python3 benchmarks/host_overhead.py --model $model \
        --batch-sizes 256 1024 --context 512 --decode-steps 40 --tokenizer $tok \
        --output-processor $processor --output-kind $kind \
        --output "$OUT/host_${processor}_$kind.json"
    done
  done
  for workload in chat batch; do
    for core in "" --engine-core-process; do
      run_in . "${workload}${core:- in one process}" python3 -m parashift.cli bench throughput \
        --workload $workload --num-requests "${NUM:-200}" --model $model --tokenizer $tok \
        --dtype bfloat16 --cuda-graphs --max-model-len 8192 $core \
        --output-json "$OUT/throughput_$workload${core:+_core}.json"
    done
  done
  exit 0
fi
before=${BEFORE:?the earlier tree}
if [ "${PART:-host}" = throughput ]; then
  for workload in chat batch; do
    for tree in before after; do
      dir=$here; [ $tree = before ] && dir=$here/$before
      run_in "$dir" $tree python3 -m parashift.cli bench throughput --workload $workload \
        --num-requests "${NUM:-200}" --model "$here/$model" --skip-tokenizer-init --dtype bfloat16 \
        --cuda-graphs --max-model-len 8192 --output-json "$OUT/throughput_${workload}_$tree.json"
    done
  done
  exit 0
fi
for tree in before after; do
  dir=$here; [ $tree = before ] && dir=$here/$before
  run_in "$dir" $tree python3 "$here/benchmarks/host_overhead.py" --model "$here/$model" \
    --batch-sizes 256 1024 --context 512 --decode-steps 40 --tokenizer "$here/$tok" \
    --output "$OUT/host_$tree.json"
done
for tree in before after; do
  dir=$here; [ $tree = before ] && dir=$here/$before
  run_in "$dir" $tree python3 benchmarks/decode_throughput.py --model "$here/$model" \
    --batch-sizes 256 512 --context 1024 --decode-steps 32 --cuda-graphs \
    --output "$OUT/decode1024_$tree.json"
  run_in "$dir" $tree python3 benchmarks/decode_throughput.py --model "$here/$model" \
    --batch-sizes 1024 --context 640 --decode-steps 32 --cuda-graphs \
    --output "$OUT/decode640_$tree.json"
done
