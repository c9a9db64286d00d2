#!/usr/bin/env bash
# Session 50's sixth call (one H200): the final tree (.) against e9afce5 (.before: the tree of
# the session's claims, before PARASHIFT_ATTN_ROPE_PREFETCH's removal and the qkvparts merge
# and its revert), 8B bf16 b64, one engine a run, the trees in turn, two runs each.
set -u
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
E8="benchmarks/decode_throughput.py --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs"
for i in 1 2; do
  for tree in after before; do
    dir=$ROOT; [ $tree = before ] && dir=$ROOT/.before
    ( cd $dir && PYTHONPATH=$dir:/tmp/site timeout 150 python3 $E8 --output $OUT/${tree}_$i.json > $OUT/${tree}_$i.log 2>&1 )
    echo "$tree $i rc=$?" >> $OUT/steps
  done
done
cat $OUT/steps
for f in $OUT/*_?.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1].split('/')[-1], [(r['batch'], round(r['step_ms'],4), round(r['fraction_of_floor'],4)) for r in d['rows']], d.get('split_parts_norm'))" $f; done
