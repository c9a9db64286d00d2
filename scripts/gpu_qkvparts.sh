#!/usr/bin/env bash
# Issue 61 (session 50, helper qkvparts): the QKV GEMM's K split into parts that the RoPE +
# KV-write kernel after it sums (PARASHIFT_SPLIT_PARTS_ROTARY, default 0), on ONE H200, in
# priority order (BUDGET_S, 150 by default on a warm machine: ~140 s; the last step is skipped
# first, BUDGET_S=210 runs it; NEED_SCALE=2 on a cold machine):
# 1. kernel_tests (~30 s, compiles included): parts-out GEMM + summing rotary kernel bit for
#    bit the ticket path of the same config + the plain rotary kernel (q out, K and V pools),
#    bf16 and FP8 candidates at the 8B's QKV shape (40, 64 rows) and an odd one;
# 2. engine_tokens (~25 s): the tiny bf16 engine's greedy tokens at 40 rows with the parts
#    forced on (any timing) equal to those of the same config summed by tickets, and that the
#    parts ran;
# 3. timings (~30 s): benchmarks/split_parts_rotary.py at 64 rows: QKV (+ rotary) as the
#    choice times them, bf16 and FP8;
# 4. engine_bf16 (~55 s): decode_throughput 8B bf16 b64 (context 1024, CUDA graphs): default
#    against PARASHIFT_SPLIT_PARTS_ROTARY=1, graph variants in one engine, 3 rounds in turn;
# 5. engine_fp8 (~60 s): the same in FP8 (--no-dot-configs).
# Usage (repository root): OUT=dir [BUDGET_S=150] [NEED_SCALE=1] bash scripts/gpu_qkvparts.sh
set -u
source scripts/budget_step.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
ENGINE="--model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 64 --context 1024 \
  --decode-steps 32 --cuda-graphs --rounds 3 --graph-variants PARASHIFT_SPLIT_PARTS_ROTARY=1"
budget=${BUDGET_S:-150}
TESTS="env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider"
mkdir -p "$OUT"
budget_step kernel_tests 30 $TESTS tests/kernels/test_parts_rotary.py -k ticket_path
budget_step engine_tokens 25 $TESTS tests/layers/test_split_parts_rotary.py \
  -k "engine and not fp8"
budget_step timings 30 python3 benchmarks/split_parts_rotary.py --rows 64 --no-dot-configs \
  --output "$OUT/timings.json"
budget_step engine_bf16 55 python3 benchmarks/decode_throughput.py $ENGINE \
  --output "$OUT/engine_bf16.json"
budget_step engine_fp8 60 python3 benchmarks/decode_throughput.py $ENGINE --quantization fp8 \
  --no-dot-configs --output "$OUT/engine_fp8.json"
cat "$OUT/steps"
grep -h '^{"pair"' "$OUT/timings.log" 2>/dev/null
for f in "$OUT"/engine_*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('variants'), d.get('split_parts_rotary'))" "$f"
done
exit 0
