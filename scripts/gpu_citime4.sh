#!/usr/bin/env bash
# CI time (helper citime4), one H200, <= 120 s (BUDGET_S; the time is a guess: 7 attention
# configurations x 3 dtypes compile): the CUDA twins of
# the tests whose cases changed, where they run compiled: the batch-invariant attention
# (tests/deterministic/test_kernels.py: its variants now at GQA groups of 2, the default case
# at 4) and the small experts (tests/kernels/test_moe_small.py: its CUDA cases unchanged, the
# 16-token case left to CUDA alone).
# Usage (repository root): OUT=dir [BUDGET_S=120] bash scripts/gpu_citime4.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-120}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/deterministic/test_kernels.py::test_attention_cuda tests/kernels/test_moe_small.py::test_cuda
