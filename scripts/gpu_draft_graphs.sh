#!/usr/bin/env bash
# Issue 63: the draft model's own CUDA graphs on one H200: the GPU test (graphs propose what
# eager proposes; output = no speculation), then draft + verification step times (8B target,
# 1B draft shape) with the draft eager and with its graphs, in one call. JSON to $OUT.
# Usage: OUT=dir bash scripts/gpu_draft_graphs.sh
set -u
S=benchmarks/shapes
python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_engine.py -k "draft_model_graphs or verification_steps" \
  2>&1 | tail -4
for g in no-draft-cuda-graphs draft-cuda-graphs; do
  timeout 280 python3 benchmarks/spec_verify.py --model $S/llama-3.1-8b.json --draft-model $S/llama-3.2-1b.json \
    --batch-sizes 1 4 16 --ks 1 2 4 --context 1024 --steps 12 --$g --output "$OUT/draft_$g.json" \
    > "$OUT/draft_$g.log" 2>&1
  echo "[$g rc=$?]"; grep -E '^\{"batch' "$OUT/draft_$g.log" | cut -c1-160
done
