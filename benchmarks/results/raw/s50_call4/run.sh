#!/usr/bin/env bash
# Session 50's fourth call (x2): GPU tests only. Lane 0: the split parts' engine test (forced
# parts against the same split config by tickets, bf16 and FP8) and the parts kernels; lane 1:
# the RoPE fold without its removed prefetch (one-launch kernel against the pair, an engine's
# tokens), the dense and gated TMA kernels, the layers' CUDA cases.
set -u
export PYTHONUNBUFFERED=1
source scripts/budget_step.sh
TESTS="env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider"
( export CUDA_VISIBLE_DEVICES=0 STEP_DIR=$OUT/lane0; mkdir -p $STEP_DIR; budget=500
  budget_step split_engine 150 taskset -c 0-13 $TESTS tests/layers/test_split_parts_norm.py
  budget_step split_kernels 60 taskset -c 0-13 $TESTS tests/kernels/test_parts_rmsnorm.py
  budget_step fp8_input 120 taskset -c 0-13 $TESTS tests/layers/test_fp8_input.py tests/layers/test_fp8_gated_silu.py
) > $OUT/lane0.out 2>&1 &
( export CUDA_VISIBLE_DEVICES=1 STEP_DIR=$OUT/lane1; mkdir -p $STEP_DIR; budget=500
  budget_step rope_fold 150 taskset -c 14-27 $TESTS tests/attention/test_rotate_attend.py
  budget_step tma_kernels 120 taskset -c 14-27 $TESTS tests/kernels/test_dense_gemm_tma.py tests/kernels/test_dense_gated_tma.py
  budget_step layers 150 taskset -c 14-27 $TESTS tests/layers/test_dense_gated_silu.py tests/layers/test_silu_gemv.py tests/layers/test_norm_router.py
) > $OUT/lane1.out 2>&1 &
wait
cat $OUT/lane0.out $OUT/lane1.out | cut -c1-300
