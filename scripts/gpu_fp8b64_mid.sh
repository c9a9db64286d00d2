#!/usr/bin/env bash
# Issue 60 (helper fp8b64: 8B FP8 decode at 64 rows), mid-session call on ONE H200, in
# priority order (BUDGET_S, 235 by default, skips the last first). Three launch-time switches
# of the FP8 GEMMs are A/B'd: PARASHIFT_FP8_TMA_PREFETCH_KB (the TMA GEMM's programs pull the
# start of their weight slice into L2 before the PDL wait), PARASHIFT_FP8_EARLY_SCALES (the
# tile's scales and bias loaded before the main loop, not after it) and
# PARASHIFT_FP8_EARLY_TICKET (a K split's ticket taken before its part is stored: the tile's
# last program keeps its own in registers); ALL: the three at once.
# 1. GPU tests: the TMA FP8 GEMM (registered configs, row tiles of 32; the switches give the
#    same bits);
# 2. the engine's GEMM candidates compiled in 15 processes (fp8_gemm_sweep.py --warm-only),
#    the TMA ones under the switches too;
# 3. decode_throughput FP8 b64 (context 1024, CUDA graphs) in one engine, its decode graphs
#    captured again per setting (--graph-variants), 3 rounds each in turn; the first rounds of
#    PDL off (each kernel's own time, per launch grid) and of the default profiled;
# 4. benchmarks/fp8_chain_variants.py, batch 64: the 8B's FP8 layers as the engine runs them
#    (fused input quantization, PDL, CUDA graphs) under each setting, replayed in turn;
# 5. fp8_gemm_sweep.py at 64 rows: the registered and the "b64" tiles, x quantized before (as
#    the fused norms hand it), timed in the decode chain (PDL on), plain and with ALL.
# Usage (repository root): OUT=dir [BUDGET_S=235] bash scripts/gpu_fp8b64_mid.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-235}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
PF=PARASHIFT_FP8_TMA_PREFETCH_KB
EARLY=PARASHIFT_FP8_EARLY_SCALES
ALL=$PF=64,$EARLY=1,PARASHIFT_FP8_EARLY_TICKET=1
budget_step gpu_tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemm_tma.py
budget_step warm 40 python3 benchmarks/fp8_gemm_sweep.py --warm-only --workers 15 \
  --settings $PF=64 $EARLY=1 $ALL
budget_step decode 80 python3 benchmarks/decode_throughput.py --model $EIGHT_B --quantization fp8 \
  --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3 \
  --graph-variants $PF=64 $EARLY=1 $ALL PARASHIFT_PDL=0 --profile \
  --profile-variants PARASHIFT_PDL=0 default --output "$OUT/decode.json"
budget_step chain 40 python3 benchmarks/fp8_chain_variants.py --batch-sizes 64 --repeats 21 \
  --variants default $PF=64 $PF=128 $EARLY=1 PARASHIFT_FP8_EARLY_TICKET=1 $ALL PARASHIFT_PDL=late \
  --output "$OUT/chain.json"
budget_step sweep 45 python3 benchmarks/fp8_gemm_sweep.py --rows 64 --kernels b64 --x-fp8 --chain \
  --settings default $ALL --workers 15 --output "$OUT/sweep.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/chain.log | cut -c1-1500
grep -h '"variants"' -A40 "$OUT"/decode.log | head -60
