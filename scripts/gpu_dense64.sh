#!/usr/bin/env bash
# Issue 61 item 3 (helper dense64: 8B bf16 decode at 64 and 256 rows) on ONE H200, in priority
# order (BUDGET_S, 200 by default, skips the last steps first). CALL=1 (as the first call ran,
# at 0b68ff3):
# 1. benchmarks/dense_gemm_sweep.py: the 8B's GEMMs at 64 and 256 rows, cuBLAS against every
#    TMA config (compiled first in 15 processes: Triton's cache then serves the tests and the
#    engine), the weight prefetch before the PDL wait at 0 and 64 KB, in the decode chain;
#    each config's output checked against cuBLAS's on every shape;
# 2. decode_throughput bf16 b64 and b256 (context 1024, CUDA graphs) in one engine: the TMA
#    GEMM chosen per shape (default) against cuBLAS everywhere (PARASHIFT_DENSE_TMA=0) and PDL
#    off, 2 rounds in turn; the default and PDL off profiled (each kernel's own time);
# 3. GPU tests of the 16-bit TMA GEMM (kernels/dense_gemm_tma.py) and its dispatch.
# CALL=2 (the kernel at 33-64 rows, the LM head too, no prefetch by default, pruned configs
# and 32-row weight tiles):
# 1. dense_gemm_sweep.py at 64 rows (the tables for the log; its 15 compile processes warm
#    Triton's cache for the engine);
# 2. decode_throughput b64: default against PARASHIFT_DENSE_TMA=0, the one-launch attention's
#    first two KV tiles pulled into L2 before its PDL wait (PARASHIFT_ATTN_FUSED_PREFETCH_TILES=2)
#    and PARASHIFT_PDL=late, 3 rounds in turn;
# 3. GPU tests of the kernel and dispatch, of the skinny GEMM and GEMM timing (refactored), and
#    of the attention right after a PDL KV write (the prefetch on);
# 4. the engine's greedy tokens with the kernel forced against cuBLAS's (SmolLM2 bf16);
# 5. decode_attention_sweep.py at b64 (contexts 1024 and 1040: the engine's are 1028-1060) and
#    b256 (1040), graphs for 2,048 tokens as the engine's: the one-launch kernel's tiles, warps
#    and stages (the engine's b64 attention ran 70.7 µs a layer in call 1 against 65.8 in
#    session 44's sweep at 1024).
# CALL=3 (call 2's engine run failed to compile the attention prefetch: a variable's type
# redefined in the kernel; fixed, checked by compiling for sm_90 on the CPU):
# 1. the attention right after a PDL KV write, the prefetch on (GPU test; a failure drops
#    the prefetch variant below);
# 2. decode_throughput b64: default against PARASHIFT_DENSE_TMA=0, the attention prefetch
#    (PARASHIFT_ATTN_FUSED_PREFETCH_TILES=2), the attention's tiles in one masked loop
#    (PARASHIFT_ATTN_FUSED_ONE_TILE_LOOP=1: call 2's sweep had b64 at 1,040 tokens 4.3% slower
#    than at 1,024) and PARASHIFT_PDL=late, 2 rounds in turn;
# 3. the engine's greedy tokens with the kernel forced against cuBLAS's (a tiny random Llama
#    with peaked logits, bf16: SmolLM2 is not on the GPU machine);
# 4. the kernel's GPU tests.
# Usage (repository root): OUT=dir [BUDGET_S=200] [CALL=3] bash scripts/gpu_dense64.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-200}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
if [ "${CALL:-3}" = 3 ]; then
  budget_step attn_test 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    "tests/attention/test_triton_backend.py::test_decode_right_after_a_pdl_kv_write"
  PREFETCH_VARIANT=PARASHIFT_ATTN_FUSED_PREFETCH_TILES=2
  [ "$(cat "$OUT/attn_test.rc" 2>/dev/null)" = 0 ] || PREFETCH_VARIANT=
  budget_step decode 80 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
    --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 2 \
    --graph-variants PARASHIFT_DENSE_TMA=0 $PREFETCH_VARIANT PARASHIFT_ATTN_FUSED_ONE_TILE_LOOP=1 \
    PARASHIFT_PDL=late \
    --output "$OUT/decode.json"
  budget_step engine_tokens 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
    -p no:cacheprovider tests/engine/test_gpu_dense_gemm.py
  budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_dense_gemm_tma.py
elif [ "${CALL}" = 1 ]; then
  budget_step sweep 45 python3 benchmarks/dense_gemm_sweep.py --rows 64 256 --prefetch-kb 0 64 \
    --workers 15 --output "$OUT/sweep.json"
  budget_step decode 100 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
    --batch-sizes 64 256 --context 1024 --decode-steps 32 --cuda-graphs --rounds 2 \
    --graph-variants PARASHIFT_DENSE_TMA=0 PARASHIFT_PDL=0 \
    --profile --profile-variants default PARASHIFT_PDL=0 --output "$OUT/decode.json"
  budget_step gpu_tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_dense_gemm_tma.py
else
  budget_step sweep 25 python3 benchmarks/dense_gemm_sweep.py --rows 64 --workers 15 \
    --shapes qkv o gate_up down lm_head --output "$OUT/sweep.json"
  budget_step decode 80 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
    --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3 \
    --graph-variants PARASHIFT_DENSE_TMA=0 PARASHIFT_ATTN_FUSED_PREFETCH_TILES=2 PARASHIFT_PDL=late \
    --output "$OUT/decode.json"
  budget_step gpu_tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_dense_gemm_tma.py tests/kernels/test_gemm_timing.py \
    tests/kernels/test_skinny_gemm.py "tests/attention/test_triton_backend.py::test_decode_right_after_a_pdl_kv_write"
  budget_step engine_tokens 45 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
    -p no:cacheprovider tests/engine/test_gpu_dense_gemm.py
  budget_step attention 25 python3 benchmarks/decode_attention_sweep.py --model $EIGHT_B \
    --configs --config-cells 64x1024 64x1040 256x1040 --graph-len 2048 --output "$OUT/attention.json"
fi
cat "$OUT/steps"
grep -h '^{"proj"' "$OUT"/sweep.log 2>/dev/null | cut -c1-600
grep -h '"variants"' -A40 "$OUT"/decode.log | head -50
grep -h '"us_per_layer"' "$OUT"/attention.log 2>/dev/null | head -20
