#!/usr/bin/env bash
# Session 43's last call (nvidia-h200-x2), as scripts/gpu_final_ab.sh runs it: GPU 0: 8B decode
# b1/b64, FP8 then bf16; GPU 1: Qwen3-30B-A3B decode b1/b64, then prefill 512/4,096 bf16 and
# FP8; then both GPUs: $BOTH (the mixed-graph A/B). Usage (repository root, $BEFORE unpacked
# there): OUT=dir BEFORE=.before [BUDGET_S=340] [BOTH="command"] bash scripts/gpu_s43_final.sh
BUDGET_S=${BUDGET_S:-340} NEED_FP8=100 NEED_BF16=60 NEED_MOE=75 \
GPU0='decode8b before fp8 1; decode8b after fp8 1; decode8b after bf16 1; decode8b before bf16 1' \
GPU1='moe before; moe after
  prefill after fp8; prefill after bf16; prefill after fp8 _fast PARASHIFT_FP8_FAST_ACCUM=1
  prefill before fp8; prefill before bf16' \
  exec bash "$(dirname "$0")/gpu_final_ab.sh"
