#!/usr/bin/env bash
# Issues 60/61 (helper attnb1): the one-row decode chain's attention, on ONE H200, in priority
# order (BUDGET_S, 235 by default, skipping what would pass it): the GPU attention tests (the
# preloading split kernel right after a PDL-launched KV write, graphs, warm-up, padding); the
# 8B FP8 decode chain at one row (32 layers, graphs, PDL on) with PARASHIFT_ATTN_PRELOAD on
# and off; the FP8 engine at batch 1, context 1024, its decode graphs captured with the switch
# on and off (--graph-variants, alternating rounds).
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-235}
mkdir -p "$OUT"
source scripts/budget_step.sh
llama=benchmarks/shapes/llama-3.1-8b.json
budget_step gpu_tests 50 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
  tests/attention/test_triton_backend.py tests/kernels/test_pdl.py \
  -k "(test_triton_backend and (decode or graph or padding or warm_up or forced)) or rotary_and_attention"
budget_step chain_fp8_b1 60 python3 benchmarks/fp8_chain_variants.py --batch-sizes 1 \
  --layers 32 --repeats 21 --no-dot-configs --variants default PARASHIFT_ATTN_PRELOAD=0 \
  --output "$OUT/chain_fp8_b1.json"
budget_step engine_fp8_b1 110 python3 benchmarks/decode_throughput.py --model $llama \
  --batch-sizes 1 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
  --graph-variants PARASHIFT_ATTN_PRELOAD=0 --rounds 3 --output "$OUT/engine_fp8_b1.json"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
for line in open(f"{out}/steps") if os.path.exists(f"{out}/steps") else []:
    print("step", line.strip())
if os.path.exists(f"{out}/chain_fp8_b1.json"):
    for r in json.load(open(f"{out}/chain_fp8_b1.json"))["rows"]:
        print("chain b%d" % r["batch"], r["same_bits"], {k: v["us_per_layer"] for k, v in
                                                         r["variants"].items()})
if os.path.exists(f"{out}/engine_fp8_b1.json"):
    print("engine", json.dumps(json.load(open(f"{out}/engine_fp8_b1.json")).get("variants")))
PY
