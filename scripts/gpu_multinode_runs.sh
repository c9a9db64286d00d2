#!/usr/bin/env bash
# Issue 23's measurement on nvidia-h200-x2: PP=2 and DP=2 of the 8B shape launched on one
# node (2 GPUs) and on two "nodes" of one GPU each over TCP (NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1, set by the benchmark for the two-node launches); decode step time at
# batch 1 and 64 (context 1024), and the control channel's latency per step (pipe, TCP).
# Usage: OUT=dir bash scripts/gpu_multinode_runs.sh
set -eu
python3 benchmarks/multinode.py --model benchmarks/shapes/llama-3.1-8b.json --plans pp2 dp2 \
  --batch-sizes 1 64 --context 1024 --decode-steps 32 --channel-steps 512 \
  --out "${OUT:?a folder for the JSON}/multinode.json" 2>&1 | grep -E '^(pp2|dp2|channel)|Error|error' || true
test -s "$OUT/multinode.json"
