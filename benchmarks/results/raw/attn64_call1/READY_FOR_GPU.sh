# budget: 150
# helper attn64, call 1: decode attention at 64-256 rows against the KV bandwidth (issues 60, 61).
# 1. kernel sweep (bf16 KV, 8B heads, graphs for 2,048 tokens, contexts 1,040 as the engine's):
#    the one-launch kernel against the balanced (stream-K) kernel's variants and read-only ceilings
#    (the same grid and loads; whole pool blocks; a flat buffer);
# 2. GPU tests of the balanced kernel (odd lengths, GQA, block sizes, graphs);
# 3. the same in a chain after the rotary kernel (PDL), the top variants;
# 4. FP8 KV at b64.
set -u
export PYTHONUNBUFFERED=1
budget=150
mkdir -p "$OUT"
source scripts/budget_step.sh
M=benchmarks/shapes/llama-3.1-8b.json
budget_step sweep 70 python3 benchmarks/decode_attention_balance.py --model $M \
  --cells 64x1040 256x1040 --output "$OUT/sweep.json"
budget_step tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
  tests/attention/test_triton_backend.py tests/attention/test_rotate_attend.py -k "balanced or wide"
budget_step chain 22 python3 benchmarks/decode_attention_balance.py --model $M --chain \
  --cells 64x1040 256x1040 --variants fused balanced-3 balanced-2 fused-one-loop preload-wide \
  --output "$OUT/chain.json"
budget_step fp8 14 python3 benchmarks/decode_attention_balance.py --model $M \
  --kv-cache-dtype fp8 --cells 64x1040 --variants fused balanced-3 balanced-2 preload-wide \
  --output "$OUT/fp8.json"
echo "total $SECONDS s"
