# budget: 90
# helper attn64, call 3 (issues 60, 61): FP8 KV decode attention, values read as 16-bit pairs
# (PARASHIFT_ATTN_FP8_PAIRS=1), now with 3 stages in the one-launch kernel below 8 programs an SM
# (call 2: 67.5 against 80.4 us at b64, 243.7 against 295.0 at b8 x 32k; 91.8 / 331.3 unpaired).
# 1. GPU tests: pairs in graphs for longer contexts (one-launch, preloading, merged), the
#    one-launch kernel's pairs at 8B heads;
# 2. the preloading split kernel with pairs at b1 / b4, 32k and 128k (never timed);
# 3. the one-launch kernel's pairs configs at b64, b256 (1,040) and b8 x 32k, and its products
#    in fp16 (PARASHIFT_ATTN_FP8_F16=1: one conversion from E4M3 instead of two);
# 4. if time is left: the engine, 8B bf16 weights with FP8 KV at b64, default against pairs.
set -u
export PYTHONUNBUFFERED=1
budget=90
mkdir -p "$OUT"
source scripts/budget_step.sh
M=benchmarks/shapes/llama-3.1-8b.json
budget_step tests 18 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_triton_backend.py \
  -k "(longer_context and kv_dtype1 and fp8-pairs) or (fp8_pairs_decode and 32-8-128) or f16"
budget_step sweep_b1 12 python3 benchmarks/decode_attention_sweep.py --model $M \
  --kv-cache-dtype fp8 --batches 1 4 --contexts 32768 131072 --pdl 1 --launches 11 \
  --fp8-pairs 0 1 --output "$OUT/sweep_b1.json"
budget_step sweep_fp8 14 python3 benchmarks/decode_attention_ceiling.py --model $M \
  --kv-cache-dtype fp8 --cells 64x1040 256x1040 8x32768 --variants fused fused-s3 fp8-pairs \
  fp8-pairs-f16 fp8-pairs-s2 fp8-pairs-s4 fp8-pairs-t128-s3 --output "$OUT/sweep_fp8.json"
budget_step decode_fp8kv 45 python3 benchmarks/decode_throughput.py --model $M \
  --kv-cache-dtype fp8 --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs \
  --rounds 2 --graph-variants PARASHIFT_ATTN_FP8_PAIRS=1 \
  PARASHIFT_ATTN_FP8_PAIRS=1,PARASHIFT_ATTN_FP8_F16=1 --output "$OUT/decode_fp8kv.json"
echo "total $SECONDS s"
