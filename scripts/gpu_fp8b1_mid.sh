#!/usr/bin/env bash
# Issues 60/61 (helper fp8b1), mid-session call on ONE H200, in priority order (BUDGET_S, 150
# by default, cuts the last first):
# 1. GPU tests of the new kernels: the GEMVs forming SiLU·mul, in gate_up's epilogue or on
#    down's input (bit-exact against the same config and SiLU-and-mul, one config a family,
#    FP8 and bf16 weights), the choice of them, the
#    chain timing's input kernel and both timing modes, the row argmax (kernels/argmax.py);
#    then the argmax's µs against torch's (benchmarks/argmax.py);
# 2. benchmarks/decode_chain.py, FP8 weights, batch 1: the 8B layer chain with the GEMM
#    choices timed as main times them (graph), in the decode chain (chain), and chain with
#    SiLU·mul in the gate_up GEMV or in the down GEMV;
# 3. the same with bf16 weights;
# 4. the engine's greedy tokens with SiLU·mul in the gate_up GEMV equal to without (bf16,
#    FP8; tiny Llama, CUDA graphs).
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_fp8b1_mid.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 35 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv.py tests/kernels/test_gated_gemv.py tests/kernels/test_gemm_timing.py \
  tests/kernels/test_argmax.py \
  -k "gated_cuda or silu_out_cuda or measured_choice or input_kernel or both_modes or (argmax and cuda)"
budget_step argmax 10 python3 benchmarks/argmax.py --output "$OUT/argmax.json"
budget_step chain_fp8 50 python3 benchmarks/decode_chain.py --weights fp8 --no-dot-configs \
  --output "$OUT/chain_fp8.json"
budget_step chain_bf16 50 python3 benchmarks/decode_chain.py --weights bf16 \
  --output "$OUT/chain_bf16.json"
budget_step engine_tokens 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider tests/layers/test_silu_gemv.py -k "fused_engine and gate_up"
cat "$OUT/steps"
grep -h '^{' "$OUT"/argmax.log "$OUT"/chain_*.log | cut -c1-900
