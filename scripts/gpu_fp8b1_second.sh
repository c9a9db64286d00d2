#!/usr/bin/env bash
# Issues 60/61 (helper fp8b1), the second mid-session call on ONE H200 (60 s by BUDGET_S, the
# last step first cut): the GPU tests new since the first call (SiLU·mul in the gate_up
# GEMV's epilogue, bit-exact against the same config and SiLU-and-mul; its choice; the
# sampler taking the argmax kernel), then benchmarks/decode_chain.py at batch 1 with main's
# GEMM timing, without and with the gate_up fusion (the unfused GEMMs' choices shared), FP8
# then bf16.
# Usage (repository root): OUT=dir [BUDGET_S=60] bash scripts/gpu_fp8b1_second.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-60}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv.py tests/kernels/test_gated_gemv.py tests/kernels/test_argmax.py \
  -k "silu_out_cuda or (measured_choice and gate_up) or sampler_takes"
for weights in fp8 bf16; do
  budget_step "gate_up_$weights" 15 python3 benchmarks/decode_chain.py --weights $weights \
    --no-dot-configs --variants graph graph_silu_gate_up --output "$OUT/gate_up_$weights.json"
done
cat "$OUT/steps"
grep -h '^{' "$OUT"/gate_up_*.log | cut -c1-1200
