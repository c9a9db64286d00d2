#!/usr/bin/env bash
# Session 44's last call (nvidia-h200-x2), as scripts/gpu_final_ab.sh runs it: GPU 0: the FP8
# GEMM candidates compiled for both trees, 8B decode b1/b64, FP8 in two rounds (after, before,
# after, before), bf16 in one, then the GPU tests of the session's kernels; GPU 1:
# Qwen3-30B-A3B decode b1/b64 in two rounds, 8B bf16 prefill of 32,768 and 16,384 tokens at
# 8,192 tokens a step, then GPU tests. Usage (repository root, $BEFORE unpacked there):
#   OUT=dir BEFORE=.before [BUDGET_S=540] bash scripts/gpu_s44_final.sh
GPU0='warm after; warm before; rounds 2 decode8b fp8; rounds 1 decode8b bf16
  gputests gpu0 tests/kernels/test_fp8_gemm_tma.py tests/kernels/test_pdl.py \
    tests/kernels/test_fp8_gemv.py' \
GPU1='rounds 2 moe; chunked after; chunked before
  gputests gpu1 tests/kernels/test_lse_merge.py tests/attention/test_cudnn_prefill.py \
    tests/kernels/test_moe_decode.py tests/kernels/test_fused_moe.py \
    tests/attention/test_triton_backend.py
  enginetests' \
  exec bash "$(dirname "$0")/gpu_final_ab.sh"
