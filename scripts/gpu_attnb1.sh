#!/usr/bin/env bash
# Issues 60/61 (helper attnb1): the one-row decode chain's attention, on ONE H200, in priority
# order (BUDGET_S, 235 by default, skipping what would pass it): the GPU tests (the preloading
# split kernel right after a PDL-launched KV write, RoPE and the KV write inside it, graphs,
# warm-up, padding; SmolLM2's lone sequences against the torch backend); the 8B FP8 decode
# chain at one row (32 layers, graphs, PDL on): default (preload + RoPE inside),
# PARASHIFT_ATTN_PRELOAD_MERGE=1 (its splits merged in the kernel), PARASHIFT_ATTN_ROPE=0 (preload, the rotary kernel before), PARASHIFT_ATTN_PRELOAD=0 (as
# before), PARASHIFT_PDL_EARLY_LOADS=0 (the norm weight, the rotary's positions/cos/sin/
# slots after the wait), both off (the tree before this work); the FP8 engine at batch 1,
# context 1024, its decode graphs captured in these settings (--graph-variants, rounds
# alternating).
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-240}
mkdir -p "$OUT"
source scripts/budget_step.sh
llama=benchmarks/shapes/llama-3.1-8b.json
budget_step gpu_tests 70 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_triton_backend.py tests/attention/test_rotate_attend.py \
  tests/kernels/test_pdl.py tests/engine/test_gpu_engine.py \
  -k "(test_triton_backend and (decode or graph or padding or warm_up or forced)) or rotary_and_attention or test_cuda or lone_sequences"
budget_step chain_fp8_b1 60 python3 benchmarks/fp8_chain_variants.py --batch-sizes 1 \
  --layers 32 --repeats 21 --no-dot-configs --variants default PARASHIFT_ATTN_PRELOAD_MERGE=1 PARASHIFT_ATTN_ROPE=0 \
  PARASHIFT_ATTN_PRELOAD=0 PARASHIFT_PDL_EARLY_LOADS=0 PARASHIFT_ATTN_PRELOAD=0,PARASHIFT_PDL_EARLY_LOADS=0 \
  --output "$OUT/chain_fp8_b1.json"
budget_step engine_fp8_b1 110 python3 benchmarks/decode_throughput.py --model $llama \
  --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
  --graph-variants PARASHIFT_ATTN_PRELOAD_MERGE=1 PARASHIFT_ATTN_ROPE=0 PARASHIFT_ATTN_PRELOAD=0 \
  PARASHIFT_ATTN_PRELOAD=0,PARASHIFT_PDL_EARLY_LOADS=0 --rounds 3 --output "$OUT/engine_fp8_b1.json"
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
