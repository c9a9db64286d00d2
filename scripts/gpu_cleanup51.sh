#!/usr/bin/env bash
# Helper cleanup51 (session 51) on ONE H200, ~145 s warm (150 by BUDGET_S, the last steps cut
# first): the GPU tests of the kernels whose code the removals touched (no measurement: the
# default paths' arithmetic is unchanged; NOTE.md lists the edits):
# 1. attention: the one-launch decode kernel (its ROPE path gone) and the preloading split
#    kernel (its MERGE path gone) against the reference, RoPE in the preloading kernel, the
#    rotary kernel (rotary_values.py folded in);
# 2. fp8_gemv (NORM and GATED inputs gone): plain bf16 configs, SiLU out, evict-first bits;
# 3. the FP8 GEMMs' epilogue (EARLY_TICKET gone): the launch switches' bits, registered
#    configs against the dequantized product;
# 4. the weight, rotary and attention kernels' bits with PDL on and off;
# 5. SiLU-and-mul in the gate_up GEMV (gated_gemv without its kind): the measured choice, the
#    engine's greedy tokens with it and without, bf16 and FP8;
# 6. the L2 prefetch kernel (bulk only, after its wait): spans of any size, a graphed chain's
#    bits with the prefetches and without.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_cleanup51.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "${OUT:?an output folder}"
source scripts/budget_step.sh
T="env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider"
budget_step attention 45 $T tests/attention/test_rotate_attend.py tests/kernels/test_rotary.py \
  tests/attention/test_triton_backend.py -k "cuda or new_token_first or longer_context or \
pdl_kv_write or fp8_pairs_one_row or fp8_pairs_decode or graph_replays_reset"
budget_step gemv 25 $T tests/kernels/test_fp8_gemv.py \
  -k "(test_cuda and bfloat16) or silu_out_cuda or evict_first_give"
budget_step fp8_epilogue 20 $T tests/kernels/test_fp8_gemm_tma.py \
  -k "launch_switches or registered or fewer_tokens"
budget_step pdl 15 $T tests/kernels/test_pdl.py \
  -k "weight_kernels_give or rotary_and_attention or gated_gate_up"
budget_step gated 25 $T tests/kernels/test_gated_gemv.py tests/layers/test_silu_gemv.py
budget_step l2_prefetch 15 $T tests/kernels/test_l2_prefetch.py
cat "$OUT/steps"
