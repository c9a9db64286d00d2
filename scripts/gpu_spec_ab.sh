#!/usr/bin/env bash
# Issue 63: the verification step's cost (8B shape) of this tree against $BEFORE's, in one
# call (CUDA graphs for verification steps). JSON to $OUT/verify_<tree>.json.
# Usage: OUT=dir BEFORE=.before bash scripts/gpu_spec_ab.sh
set -u
here=$(pwd)
for tree in before after; do
  dir=$here; [ $tree = before ] && dir=$here/${BEFORE:?}
  (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" timeout 240 python3 benchmarks/spec_verify.py \
    --model "$here/benchmarks/shapes/llama-3.1-8b.json" --batch-sizes 1 4 16 64 --ks 1 2 4 8 \
    --context 1024 --output "$OUT/verify_$tree.json" > "$OUT/verify_$tree.log" 2>&1)
  echo "[$tree rc=$?]"; tail -2 "$OUT/verify_$tree.log" | cut -c1-300
done
python3 - "$OUT" <<'PY'
import json, sys
rows = {t: {(r["batch"], r["k"]): r for r in json.load(open(f"{sys.argv[1]}/verify_{t}.json"))["rows"]}
        for t in ("before", "after")}
for key, b in rows["before"].items():
    a = rows["after"][key]
    print(key, "plain", b["plain_decode_ms"], a["plain_decode_ms"], "verify", b["step_ms"], a["step_ms"])
PY
