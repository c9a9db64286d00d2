#!/usr/bin/env bash
# Issue 61 (session 50, helper bgated): SiLU·mul in bf16 gate_up's TMA epilogue at 33-64 rows
# (PARASHIFT_DENSE_GATE_UP_SILU, default 0), on ONE H200, in priority order (BUDGET_S, 150 by
# default on a warm machine: ~125 s; the last steps are skipped first; NEED_SCALE=2 on a cold
# one, with BUDGET_S=250):
# 1. gpu_tests (~45 s, compiles included): every fused tiling gives the bits of each dispatch
#    config of its K step then silu_and_mul (64 rows, a partial gate tile; 37 rows in fp16;
#    the 8B's gate_up at 33 and 64 rows), the same bits with PDL off, early and late (with the
#    FP8 gated kernel's), and an engine's greedy tokens at 40 sequences with the fusion forced
#    equal to those without (bf16 tiny Llama);
# 2. engine (~55 s): decode_throughput 8B bf16 b64 (context 1024, 32 steps, CUDA graphs):
#    default against PARASHIFT_DENSE_GATE_UP_SILU=1, graph variants in one engine, 3 rounds in
#    turn; its JSON's dense_gated names what the choice took (a tiling or "unfused");
# 3. kernel_ab (~25 s): benchmarks/dense_gated_ab.py, 8B gate_up [28672, 4096] at 64 rows, the
#    pair (the dense choice's GEMM + silu_and_mul) against every fused tiling, 3 rounds,
#    in the decode chain, which tilings give the pair's bits and what the choice takes;
# 4. fp8_tests (~25 s, where time is left): the FP8 gated kernel's 8B test and its engine
#    token test (its main loop is now kernels/gated_tma.py's, sm_90 PTX unchanged on the CPU;
#    its engine test now calls tests/helpers/switch_tokens.engine_tokens).
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_bgated.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 45 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_dense_gated_tma.py tests/layers/test_dense_gated_silu.py \
  tests/kernels/test_pdl.py::test_the_gated_gate_up_gives_the_same_bits_with_pdl
budget_step engine 55 python3 benchmarks/decode_throughput.py \
  --model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 64 --context 1024 --decode-steps 32 \
  --cuda-graphs --rounds 3 --graph-variants PARASHIFT_DENSE_GATE_UP_SILU=1 \
  --output "$OUT/engine.json"
budget_step kernel_ab 25 python3 benchmarks/dense_gated_ab.py --rows 64 --rounds 3 \
  --output "$OUT/kernel_ab.json"
budget_step fp8_tests 25 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  "tests/kernels/test_fp8_gated_tma.py::test_the_8b_gate_up[64]" \
  tests/layers/test_fp8_gated_silu.py::test_the_fused_engine_gives_the_unfused_tokens_at_20_sequences
cat "$OUT/steps"
grep -h '^{' "$OUT"/kernel_ab.log 2>/dev/null | cut -c1-2000
[ -f "$OUT/engine.json" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(d.get('variants') or [(r['batch'], round(r['step_ms'], 4), \
round(r['fraction_of_floor'], 3)) for r in d['rows']], d['dense_gated'], \
[c for c in d['dense_gemm'] if c['weight'][0] == 28672])" "$OUT/engine.json"
echo "total $SECONDS s"
