#!/usr/bin/env bash
# Issue 60 (helper fp8b64: 8B FP8 decode at 64 rows), mid-session call on ONE H200, in
# priority order (BUDGET_S, 235 by default, skips the last first):
# 1. GPU tests: the TMA FP8 GEMM (registered configs, the weight prefetch before the PDL wait
#    giving the same bits);
# 2. the engine's GEMM candidates compiled in 15 processes (fp8_gemm_sweep.py --warm-only),
#    the TMA ones with the prefetch at 64 and 128 KB too;
# 3. decode_throughput FP8 b64 and b1 (context 1024, CUDA graphs) in one engine, its graphs
#    captured again per setting (--graph-variants: the TMA GEMM's weight prefetch at 64 KB a
#    program, and PDL off; the first rounds of PDL off (each kernel's own time, per launch
#    grid) and of the default profiled), 3 rounds each;
# 4. benchmarks/fp8_chain_variants.py, batch 64: the 8B's FP8 layers as the engine runs them
#    (fused input quantization, PDL, CUDA graphs), the weight prefetch at 0 (the default), 64
#    and 128 KB a program and PDL late, graphs replayed in turn;
# 5. fp8_gemm_sweep.py at 64 rows: the registered and the "b64" tiles, x quantized before (as
#    the fused norms hand it), timed in the decode chain (PDL on), prefetch 0/32/128 KB.
# Usage (repository root): OUT=dir [BUDGET_S=235] bash scripts/gpu_fp8b64_mid.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-235}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
PF=PARASHIFT_FP8_TMA_PREFETCH_KB
budget_step gpu_tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemm_tma.py
budget_step warm 35 python3 benchmarks/fp8_gemm_sweep.py --warm-only --workers 15 --prefetch-kb 64 128
budget_step decode 90 python3 benchmarks/decode_throughput.py --model $EIGHT_B --quantization fp8 \
  --batch-sizes 64 1 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3 \
  --graph-variants $PF=64 PARASHIFT_PDL=0 --profile \
  --profile-variants PARASHIFT_PDL=0 default \
  --output "$OUT/decode.json"
budget_step chain 40 python3 benchmarks/fp8_chain_variants.py --batch-sizes 64 --repeats 21 \
  --variants default $PF=64 $PF=128 PARASHIFT_PDL=late --output "$OUT/chain.json"
budget_step sweep 45 python3 benchmarks/fp8_gemm_sweep.py --rows 64 --kernels b64 --x-fp8 --chain \
  --prefetch-kb 0 32 128 --workers 15 --output "$OUT/sweep.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/chain.log | cut -c1-1500
grep -h '"variants"' -A40 "$OUT"/decode.log | head -60
