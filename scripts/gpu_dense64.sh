#!/usr/bin/env bash
# Issue 61 item 3 (helper dense64: 8B bf16 decode at 64 and 256 rows) on ONE H200, in priority
# order (BUDGET_S, 200 by default, skips the last steps first):
# 1. benchmarks/dense_gemm_sweep.py: the 8B's GEMMs at 64 and 256 rows, cuBLAS against every
#    TMA config (compiled first in 15 processes: Triton's cache then serves the tests and the
#    engine), the weight prefetch before the PDL wait at 0 and 64 KB, in the decode chain;
#    each config's output checked against cuBLAS's on every shape;
# 2. decode_throughput bf16 b64 and b256 (context 1024, CUDA graphs) in one engine: the TMA
#    GEMM chosen per shape (default) against cuBLAS everywhere (PARASHIFT_DENSE_TMA=0) and PDL
#    off, 2 rounds in turn; the default and PDL off profiled (each kernel's own time);
# 3. GPU tests of the 16-bit TMA GEMM (kernels/dense_gemm_tma.py) and its dispatch.
# Usage (repository root): OUT=dir [BUDGET_S=200] bash scripts/gpu_dense64.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-200}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
budget_step sweep 45 python3 benchmarks/dense_gemm_sweep.py --rows 64 256 --prefetch-kb 0 64 \
  --workers 15 --output "$OUT/sweep.json"
budget_step decode 100 python3 benchmarks/decode_throughput.py --model $EIGHT_B \
  --batch-sizes 64 256 --context 1024 --decode-steps 32 --cuda-graphs --rounds 2 \
  --graph-variants PARASHIFT_DENSE_TMA=0 PARASHIFT_PDL=0 \
  --profile --profile-variants default PARASHIFT_PDL=0 --output "$OUT/decode.json"
budget_step gpu_tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_dense_gemm_tma.py
cat "$OUT/steps"
grep -h '^{"proj"' "$OUT"/sweep.log | cut -c1-600
grep -h '"variants"' -A40 "$OUT"/decode.log | head -50
