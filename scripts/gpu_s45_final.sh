#!/usr/bin/env bash
# Session 45's last call (nvidia-h200-x2), as scripts/gpu_final_ab.sh runs it: GPU 0: the FP8
# GEMM candidates compiled for both trees, 8B FP8 decode b1/b64 in two rounds (after, before,
# after, before), $GPU0_TESTS, $GPU0_MORE_TESTS, a third round where the budget is left;
# GPU 1: Qwen3-30B-A3B decode b1/b64 in two rounds, $GPU1_TESTS and the engine's graph tests,
# 8B bf16 b1/b64 where the budget is left. Usage (repository root, $BEFORE unpacked there):
#   OUT=dir BEFORE=.before [BUDGET_S=540] [GPU0_TESTS=...] [GPU1_TESTS=...] bash scripts/gpu_s45_final.sh
GPU0='warm after; warm before; rounds 2 decode8b fp8
  gputests gpu0 ${GPU0_TESTS:-tests/kernels/test_fp8_gemv.py tests/kernels/test_pdl.py}
  [ -n "${GPU0_MORE_TESTS:-}" ] && gputests gpu0_more $GPU0_MORE_TESTS
  decode8b after fp8 3; decode8b before fp8 3' \
GPU1='rounds 2 moe
  gputests gpu1 ${GPU1_TESTS:-tests/attention/test_triton_backend.py tests/kernels/test_moe_small.py}
  enginetests; decode8b after bf16 1; decode8b before bf16 1' \
  exec bash "$(dirname "$0")/gpu_final_ab.sh"
