#!/usr/bin/env bash
# Helper cleanup49 (session 49) on ONE H200, ~45 s warm (60 by BUDGET_S, the last step cut
# first): the GPU tests of the kernels its change touched. The FP8 GEMV lost its norm-tail
# parameters (its default configs' sm_90 PTX is unchanged: NOTE.md) and reads its evict-first
# switch through engine_switches.switch; the norm-in-GEMV path shares norm_values.py with it:
# 1. tests/kernels/test_fp8_gemv.py on CUDA (bf16 plain configs, SiLU out, gated, norm, the
#    evict-first bits);
# 2. the weight kernels' bits with PDL on and off (tests/kernels/test_pdl.py);
# 3. the norm-in-GEMV kernel and layers and the FP8-input layers on CUDA, and the switch
#    readers (tests/test_engine_switches.py, CPU-only, seconds).
# Usage (repository root): OUT=dir [BUDGET_S=60] bash scripts/gpu_cleanup49.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-60}
: "${OUT:?an output folder}"
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gemv 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv.py \
  -k "(test_cuda and bfloat16) or silu_out_cuda or gated_cuda or evict_first_give"
budget_step pdl 12 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_pdl.py -k "weight_kernels_give_the_same_bits"
budget_step norm_layers 15 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider tests/layers/test_fp8_input.py tests/test_engine_switches.py -k "not interpreted"
cat "$OUT/steps"
