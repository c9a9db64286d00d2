#!/usr/bin/env bash
# Issue 14's no-regression runs, JSON to $OUT: this tree against the one in $BEFORE (an
# earlier commit unpacked with `git archive REV | tar -x -C .before`), interleaved on one
# machine. PART=decode: one-GPU decode of the 8B shape at batch 1 and 256 (GPU 0);
# PART=plans PLANS="tp2 shift2": the 8B Figure 9 table's plans (interactive TTFT/TPOT,
# batch throughput) on two GPUs.
# Usage: OUT=dir BEFORE=.before PART=decode|plans [PLANS="tp2 sp2"] bash scripts/gpu_substrate_runs.sh
set -u
model=benchmarks/shapes/llama-3.1-8b.json
before=${BEFORE:?the earlier tree}; here=$(pwd)
run_in() {  # run_in DIR LABEL COMMAND...
  local dir=$1 label=$2; shift 2
  (cd "$dir" && PYTHONPATH="$dir" "$@" 2>&1 | grep -E '^\{|step|Error|error' | tail -20 | sed "s/^/[$label] /")
}
if [ "${PART:?decode or plans}" = decode ]; then
  for tree in before after before after; do
    dir=$here; [ $tree = before ] && dir=$here/$before
    CUDA_VISIBLE_DEVICES=0 run_in "$dir" $tree python3 benchmarks/decode_throughput.py \
      --model "$here/$model" --batch-sizes 1 256 --context 1024 --decode-steps 32 \
      --max-model-len 8192 --cuda-graphs --output "$OUT/decode_${tree}_$RANDOM.json"
  done
else
  for plan in ${PLANS:-tp2 sp2 dp2 shift2}; do
    for tree in before after; do
      dir=$here; [ $tree = before ] && dir=$here/$before
      run_in "$dir" $tree python3 benchmarks/plans.py --model "$here/$model" --plans $plan \
        --interactive-requests 3 --batch-requests 64 --cuda-graphs --shift-threshold 256 \
        --output "$OUT/plans_${plan}_$tree.json"
    done
  done
fi
