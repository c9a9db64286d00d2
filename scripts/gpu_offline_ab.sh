#!/usr/bin/env bash
# Issue 24: the `chat` and `batch` workloads' offline throughput (`parashift bench
# throughput`, the 8B shape, every request greedy, outputs detokenized with $TOKENIZER),
# this tree against the one in $BEFORE, side by side in one call, JSON to $OUT, under each
# plan of $PLANS (single, tp2, dp2, shift2; default single).
# Usage: OUT=dir BEFORE=.before TOKENIZER=.tok [PLANS="tp2 shift2"] [WORKLOADS="chat batch"] \
#   [CHAT=1000] [BATCH=250] bash scripts/gpu_offline_ab.sh (each run starts its own engine)
set -u
here=$(pwd); before=${BEFORE:?the earlier tree}; tok=${TOKENIZER:?a tokenizer directory}
for plan in ${PLANS:-single}; do
  case $plan in
    single) flags="" ;;
    tp2) flags="--tensor-parallel-size 2" ;;
    dp2) flags="--data-parallel-size 2" ;;
    shift2) flags="--sequence-parallel-size 2 --parallel-policy shift" ;;
    *) echo "unknown plan $plan"; exit 2 ;;
  esac
  for workload in ${WORKLOADS:-chat batch}; do
    count=${CHAT:-1000}; [ $workload = batch ] && count=${BATCH:-250}
    for tree in before after; do
      dir=$here; [ $tree = before ] && dir=$here/$before
      (cd "$dir" && PYTHONPATH="$dir" timeout 280 python3 -c \
        "import sys; from parashift.cli import main; main(sys.argv[1:])" bench throughput \
        --workload $workload --num-requests "$count" $flags \
        --model "$here/benchmarks/shapes/llama-3.1-8b.json" --tokenizer "$here/$tok" \
        --max-model-len 8192 --output-json "$OUT/offline_${plan}_${workload}_$tree.json" 2>&1 \
        | grep -E "^$workload: |Error" | cut -c1-300 | sed "s/^/[$plan $workload $tree] /")
    done
  done
done
