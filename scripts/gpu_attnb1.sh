#!/usr/bin/env bash
# Issues 60/61 (helper attnb1): the one-row decode chain's small kernels, on ONE H200, in
# priority order (BUDGET_S, 240 by default, skipping what would pass it). CALL=1 (the first
# call): the GPU tests (the preloading split kernel right after a PDL-launched KV write, RoPE
# and the KV write inside it, graphs, warm-up, padding; SmolLM2's lone sequences against the
# torch backend); the 8B FP8 decode chain at one row (32 layers, graphs, PDL on) and the FP8
# engine at batch 1 (context 1024; decode graphs captured under each setting, rounds
# alternating) over default (preload + RoPE inside), PARASHIFT_ATTN_ROPE=0,
# PARASHIFT_ATTN_PRELOAD=0. CALL=2 (the default): the GPU tests of what came after (the
# in-kernel split merge, the RMSNorm and rotary kernels loading their constant inputs before
# the PDL wait: kernel tests, PDL bits, graphs); the chain over the switches; the FP8 engine
# at batch 1 and 64; Qwen3-30B-A3B (bf16, max_model_len 8192) at batch 1, this work against
# the tree before it (PARASHIFT_ATTN_PRELOAD=0,PARASHIFT_PDL_EARLY_LOADS=0); the attention
# kernels alone at batches 1-4 (decode_attention_sweep.py: preloading or not, up to 32k).
# CALL=3: call 2's GPU tests again (a crash in one had failed the rest), the chain (default,
# the in-kernel merge, the tree before), the FP8 engine at batch 1 against the tree before.
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-240}
mkdir -p "$OUT"
source scripts/budget_step.sh
llama=benchmarks/shapes/llama-3.1-8b.json
before=PARASHIFT_ATTN_PRELOAD=0,PARASHIFT_PDL_EARLY_LOADS=0
later_tests() {  # the GPU tests of calls 2 and 3
budget_step gpu_tests 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_triton_backend.py tests/attention/test_rotate_attend.py \
  tests/kernels/test_pdl.py tests/kernels/test_rmsnorm.py tests/kernels/test_rotary.py \
  tests/layers/test_layernorm.py \
  -k "right_after or longer_context or test_cuda or elementwise_and_norm or rotary_and_attention or moe_decode_kernels or graph_capture or warm_up or qk_norm_is or qk_norm_cuda or equals_transformers"
}
if [ "${CALL:-2}" = 1 ]; then
budget_step gpu_tests 70 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_triton_backend.py tests/attention/test_rotate_attend.py \
  tests/kernels/test_pdl.py tests/engine/test_gpu_engine.py \
  -k "(test_triton_backend and (decode or graph or padding or warm_up or forced)) or rotary_and_attention or test_cuda or lone_sequences"
budget_step chain_fp8_b1 60 python3 benchmarks/fp8_chain_variants.py --batch-sizes 1 \
  --layers 32 --repeats 21 --no-dot-configs --variants default PARASHIFT_ATTN_ROPE=0 \
  PARASHIFT_ATTN_PRELOAD=0 --output "$OUT/chain_fp8_b1.json"
budget_step engine_fp8 110 python3 benchmarks/decode_throughput.py --model $llama \
  --batch-sizes 1 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
  --graph-variants PARASHIFT_ATTN_ROPE=0 PARASHIFT_ATTN_PRELOAD=0 --rounds 3 \
  --output "$OUT/engine_fp8.json"
elif [ "${CALL:-2}" = 3 ]; then
later_tests
budget_step chain_fp8_b1 25 python3 benchmarks/fp8_chain_variants.py --batch-sizes 1 \
  --layers 32 --repeats 21 --no-dot-configs --variants default \
  $before --output "$OUT/chain_fp8_b1.json"
budget_step engine_fp8 50 python3 benchmarks/decode_throughput.py --model $llama \
  --batch-sizes 1 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
  --graph-variants $before --rounds 3 --output "$OUT/engine_fp8.json"
else
later_tests
budget_step chain_fp8_b1 25 python3 benchmarks/fp8_chain_variants.py --batch-sizes 1 \
  --layers 32 --repeats 21 --no-dot-configs --variants default \
  PARASHIFT_ATTN_ROPE=0 PARASHIFT_ATTN_PRELOAD=0 PARASHIFT_PDL_EARLY_LOADS=0 $before \
  --output "$OUT/chain_fp8_b1.json"
budget_step engine_fp8 60 python3 benchmarks/decode_throughput.py --model $llama \
  --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs --quantization fp8 \
  --graph-variants PARASHIFT_PDL_EARLY_LOADS=0 $before \
  --rounds 3 --output "$OUT/engine_fp8.json"
budget_step engine_qwen_b1 70 python3 benchmarks/decode_throughput.py \
  --model benchmarks/shapes/qwen3-30b-a3b.json --batch-sizes 1 --max-model-len 8192 \
  --context 1024 --decode-steps 32 --cuda-graphs --graph-variants $before \
  --rounds 3 --output "$OUT/engine_qwen_b1.json"
budget_step sweep_8b 25 python3 benchmarks/decode_attention_sweep.py --model $llama \
  --batches 1 2 4 --contexts 1024 8192 32768 --pdl 1 --output "$OUT/sweep_8b.json"
fi
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
for line in open(f"{out}/steps") if os.path.exists(f"{out}/steps") else []:
    print("step", line.strip())
if os.path.exists(f"{out}/chain_fp8_b1.json"):
    for r in json.load(open(f"{out}/chain_fp8_b1.json"))["rows"]:
        print("chain b%d" % r["batch"], {k: v["us_per_layer"] for k, v in r["variants"].items()})
if os.path.exists(f"{out}/sweep_8b.json"):
    for r in json.load(open(f"{out}/sweep_8b.json"))["rows"]:
        print("sweep b%d ctx%d fused%d preload%d %.2f us" % (r["batch"], r["context"],
                                                            r["fused"], r["preload"],
                                                            r["us_per_layer"]))
for name in ("engine_fp8", "engine_qwen_b1"):
    if os.path.exists(f"{out}/{name}.json"):
        print(name, json.dumps(json.load(open(f"{out}/{name}.json")).get("variants")))
PY
