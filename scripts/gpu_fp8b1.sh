#!/usr/bin/env bash
# Issue 60 (helper fp8b1), one H200: the residual add + RMSNorm after o_proj and after
# down_proj folded into their FP8 GEMVs, done by each launch's last program
# (PARASHIFT_NORM_AFTER_GEMV; kernels/norm_tail.py, layers/norm_after_gemv.py), in priority
# order within BUDGET_S (150 by default: ~140 s on a warm machine, later steps skipped first):
# 1. gpu_tests (~30 s): the GEMV with its norm tail against the plain GEMV + add_rms_norm at
#    the 8B's o and down shapes (1 and 3 rows, with and without E4M3 rows), in a CUDA graph,
#    and the real kernel through the layers' twins;
# 2. decode (~45 s): benchmarks/decode_throughput.py, 8B FP8 b1, context 1024, one engine
#    built with the folds (=1), its graphs captured again without them (=0), and with them but
#    without the L2 prefetch after o (its side stream then overlaps gate_up, no norm between),
#    3 interleaved rounds; the JSON's fp8_gemm says o's and down's one-row choices (the fold
#    takes a GEMV of one part of K only);
# 3. ceiling (~60 s): benchmarks/step_ceiling.py the same way: the step with the fold and
#    without, each also with PDL off (profiled: each kernel's own time, o's with its tail
#    against o and the norm apart), its kernels a step (two RMSNorms a layer fewer where both
#    folds ran: 324 -> 260), and the ceiling of the folded engine's launches;
# 4. engine_tokens (~40 s; past 150 s: BUDGET_S=190 runs it): a tiny Llama engine's greedy FP8
#    tokens with the folds against without.
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_fp8b1.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
OFF=PARASHIFT_NORM_AFTER_GEMV=0
budget_step gpu_tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_norm_tail.py tests/layers/test_norm_after_gemv.py -k "not engine"
budget_step decode 45 env PARASHIFT_NORM_AFTER_GEMV=1 python3 benchmarks/decode_throughput.py \
  --model $EIGHT_B --quantization fp8 --batch-sizes 1 --context 1024 --decode-steps 32 \
  --cuda-graphs --rounds 3 --no-dot-configs --graph-variants $OFF PARASHIFT_L2_PREFETCH=0 \
  --output "$OUT/decode.json"
budget_step ceiling 60 env PARASHIFT_NORM_AFTER_GEMV=1 python3 benchmarks/step_ceiling.py \
  --model $EIGHT_B --quantization fp8 --no-dot-configs --batch-sizes 1 --rounds 2 \
  --graph-variants $OFF PARASHIFT_PDL=0 $OFF,PARASHIFT_PDL=0 \
  --profile-variants PARASHIFT_PDL=0 $OFF,PARASHIFT_PDL=0 --output "$OUT/ceiling.json"
budget_step engine_tokens 40 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider tests/layers/test_norm_after_gemv.py -k "engine"
cat "$OUT/steps"
grep -h '"variants"\|step_ms\|kernels_per_step' "$OUT"/decode.log "$OUT"/ceiling.log 2>/dev/null \
  | cut -c1-400 | head -20
