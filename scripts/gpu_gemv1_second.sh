#!/usr/bin/env bash
# Issue 60 (helper gemv1), second call on ONE H200 (BUDGET_S, 240 by default, cuts the last
# step first):
# 1. GPU tests: the TMA GEMV (fp8_gemv_tma.py), fp8_gemv.py's pipelined loads (NUM_STAGES > 1,
#    with "ahead" the first tile before the PDL wait)
#    giving the one-stage bits, its epilogue (finish_rows: tickets, SiLU) on the registered
#    configs;
# 2. benchmarks/fp8_gemm_sweep.py at one row in the decode chain (--kernels b1: the registered
#    GEMVs, pipelined ones, the TMA GEMV, the TMA FP8 x FP8 GEMM given the row in E4M3);
# 3. benchmarks/decode_chain.py, FP8, batch 1, 32 layers (as run at 21c9d88 also without the
#    pipelined GEMV configs, then registered, and the engine's decode b1 without and with
#    them: since removed with the configs);
# 4. benchmarks/read_ceiling.py --chain: the read-only kernels timed as the sweep times the
#    GEMVs (PDL on, each call after a kernel writing a row), a first tile before the PDL wait,
#    cache hints.
# Usage (repository root): OUT=dir [BUDGET_S=240] bash scripts/gpu_gemv1_second.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-240}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 40 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv_tma.py tests/kernels/test_fp8_gemv.py \
  -k "test_fp8_gemv_tma or pipelined or silu_out_cuda or (test_cuda and tickets and bfloat16)"
budget_step sweep_b1 50 python3 benchmarks/fp8_gemm_sweep.py --rows 1 --chain --x-fp8 --kernels b1 \
  --workers 14 --output "$OUT/sweep_b1.json"
budget_step chain_fp8 40 python3 benchmarks/decode_chain.py --weights fp8 --no-dot-configs \
  --variants chain --output "$OUT/chain_fp8.json"
budget_step read_ceiling_chain 25 python3 benchmarks/read_ceiling.py --chain \
  --output "$OUT/read_ceiling_chain.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/sweep_b1.log "$OUT"/chain_fp8.log "$OUT"/engine_*.log \
  "$OUT"/read_ceiling_chain.log | cut -c1-1500
