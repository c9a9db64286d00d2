#!/usr/bin/env bash
# Issue 61 deliverable 1 (helper prefill), second call on ONE H200, in priority order
# (BUDGET_S, 235 by default, skips the last first):
# 1. the 8B's projections at 16k / 32k rows as one cuBLAS call or in row chunks of 8,192 /
#    4,096 (gemm_row_chunks.py: ms, TFLOP/s, the kernel cuBLAS ran; a layer's four called back
#    to back for 2 s each);
# 2. the engine at 32,768 and 16,384 tokens, variants interleaved in one process
#    (prefill_phases.py --variants): one cuBLAS call a GEMM (base) against row chunks of
#    4,096 and 8,192 (PARASHIFT_GEMM_ROW_CHUNK, read at each call);
# 3. the chunk route's parts (merge kernel, GQA in the call) against session 43's, each
#    variant timed in 4 rounds, the order rotated (the power cap slows whatever runs later);
# 4. chunked prefill of one 32,768-token prompt at 8,192 tokens a step, this tree's chunk route
#    (merge kernel, GQA in the call) against session 43's (PARASHIFT_CUDNN_CHUNK_FUSED=0), in
#    turn (the command of docs/results.md's chunked rows);
# 5. GPU tests: the row-chunked GEMM (bits of each chunk's call), the merge kernel, cuDNN routes.
# nvidia-smi samples clocks and power every 100 ms ($OUT/smi.csv, $OUT/marks).
# Run at 84bdaab (raw: benchmarks/results/raw/prefill_second/). Steps 1-2's row chunks were an
# engine switch then (PARASHIFT_GEMM_ROW_CHUNK, layers/row_chunked_gemm.py and its test); it
# gained nothing and was removed after this call: at a later tree those variants run the base.
# Usage (repository root): OUT=dir [BUDGET_S=235] bash scripts/gpu_prefill_second.sh
set -u
source scripts/gpu_prefill_common.sh
step gemm_chunks 40 python3 benchmarks/gemm_row_chunks.py --rows 16384 32768 --chunks 0 8192 4096 \
  --sustained-s 2 --output "$OUT/gemm_chunks.json"
step ab_32k 40 python3 benchmarks/prefill_phases.py --model $EIGHT_B --prompt-len 32768 \
  --repeats 1 --variants base PARASHIFT_GEMM_ROW_CHUNK=4096 PARASHIFT_GEMM_ROW_CHUNK=8192 \
  --ab-rounds 2 --output "$OUT/ab_32k.json"
step ab_16k 30 python3 benchmarks/prefill_phases.py --model $EIGHT_B --prompt-len 16384 \
  --repeats 1 --variants base PARASHIFT_GEMM_ROW_CHUNK=4096 PARASHIFT_GEMM_ROW_CHUNK=8192 \
  --ab-rounds 3 --output "$OUT/ab_16k.json"
step chunk_rounds 30 python3 benchmarks/prefill_attention.py --rounds 4 \
  --cases 8192:8192,8192:24576,2048:30720,16384:16384 \
  --backends cudnn_backend,cudnn_chunk_merge0_gqa0,cudnn_chunk_merge1_gqa0,cudnn_chunk_merge0_gqa1 \
  --output "$OUT/chunk_rounds.json"
chunked() {  # chunked NAME FUSED
  step "$1" 30 env PARASHIFT_CUDNN_CHUNK_FUSED=$2 python3 benchmarks/prefill_throughput.py \
    --model $EIGHT_B --prompt-lens 32768 --step-tokens 8192 --repeats 3 --output "$OUT/$1.json"
}
chunked chunked_fused 1
chunked chunked_s43 0

step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  -k "not interpreted" tests/kernels/test_lse_merge.py \
  tests/attention/test_cudnn_prefill.py
kill "$clock_sampler" 2> /dev/null
cat "$OUT/steps"
grep -h '^{' "$OUT"/gemm_chunks.log | cut -c1-300
grep -h '"median_ms"' "$OUT"/ab_*.log | cut -c1-600
grep -h '^{' "$OUT"/chunked_*.log | cut -c1-300
