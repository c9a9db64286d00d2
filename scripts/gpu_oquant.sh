#!/usr/bin/env bash
# Issue 60 (helper oquant: o_proj's input quantized by the decode attention), one call on ONE
# H200, in priority order (BUDGET_S, 150 by default on a warm machine, skips the last first;
# NEED_SCALE=2 on a cold one). About 150 s warm: 20 + 25 + 75 + 30.
# 1. GPU tests of the kernel: the one-launch decode's E4M3 rows and scales equal
#    fp8_gemm.quantize_rows of its output bit for bit, in a graph replayed with new lengths,
#    its output unchanged; split or mixed launches make none;
# 2. the FP8 GEMM candidates compiled in 15 processes (the engine's timing then compiles none);
# 3. decode_throughput, 8B FP8 b64, context 1024, CUDA graphs, one engine: the default graphs
#    against PARASHIFT_ATTN_O_FP8=1's (graph variants, 3 rounds in turn);
# 4. a tiny FP8 engine's greedy tokens and logprobs equal with PARASHIFT_ATTN_O_FP8 on and off
#    (every decode launch unsplit, every FP8 GEMM cuBLASLt's: o_proj takes the rows each step).
# Usage (repository root): OUT=dir [BUDGET_S=150] [NEED_SCALE=1] bash scripts/gpu_oquant.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
budget_step kernel_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_triton_backend.py -k "fp8_rows"
budget_step warm 25 python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 15
budget_step decode 75 python3 benchmarks/decode_throughput.py --model $EIGHT_B --quantization fp8 \
  --no-dot-configs --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3 \
  --graph-variants PARASHIFT_ATTN_O_FP8=1 --output "$OUT/decode.json"
budget_step engine_test 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/layers/test_fp8_input.py -k "fp8_rows"
cat "$OUT/steps"
grep -h '"variants"' -A30 "$OUT"/decode.log | head -40
