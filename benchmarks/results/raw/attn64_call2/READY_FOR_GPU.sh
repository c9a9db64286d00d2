# budget: 150
# helper attn64, call 2 (issues 60, 61): the one-launch decode attention over an FP8 KV pool, its
# values read as 16-bit pairs (PARASHIFT_ATTN_FP8_PAIRS=1; call 1: FP8 KV at b64 ran 91.5 us a layer,
# 0.35 of the copy bandwidth, slower than bf16's 69.7: its values read a byte at a time).
# 1. GPU tests of the pairs path; 2. kernel sweep over FP8 KV at b64, b256, b8 x 32k;
# 3. the engine, 8B bf16 weights with FP8 KV at b64 and b256: default against pairs, 2 rounds;
# 4. bf16 KV sweep again with the fixed flat ceiling (16 KB rows).
set -u
export PYTHONUNBUFFERED=1
budget=150
mkdir -p "$OUT"
source scripts/budget_step.sh
M=benchmarks/shapes/llama-3.1-8b.json
budget_step tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
  tests/attention/test_triton_backend.py -k "fp8_pairs or fp8-pairs"
budget_step sweep_fp8 25 python3 benchmarks/decode_attention_ceiling.py --model $M \
  --kv-cache-dtype fp8 --cells 64x1040 256x1040 8x32768 --output "$OUT/sweep_fp8.json"
budget_step decode_fp8kv 70 python3 benchmarks/decode_throughput.py --model $M \
  --kv-cache-dtype fp8 --batch-sizes 64 256 --context 1024 --decode-steps 32 --cuda-graphs \
  --rounds 2 --graph-variants PARASHIFT_ATTN_FP8_PAIRS=1 --output "$OUT/decode_fp8kv.json"
budget_step sweep_bf16 15 python3 benchmarks/decode_attention_ceiling.py --model $M \
  --cells 64x1040 256x1040 --variants fused fused-one-loop read-paged read-flat read-blocks-8 \
  --output "$OUT/sweep_bf16.json"
echo "total $SECONDS s"
