#!/usr/bin/env bash
# Session 50's second call (x2): lane 0 the GPU tests of helpers oquant and splitnorm, then the
# 8B bf16 b64 A/B of the split parts and their timings; lane 1 the 8B FP8 b64 A/B of both
# (PARASHIFT_ATTN_O_FP8, PARASHIFT_SPLIT_PARTS_NORM, both), graph variants in one engine.
set -u
export PYTHONUNBUFFERED=1
source scripts/budget_step.sh
PYTHONPATH=.:/tmp/site python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 28 > $OUT/warm.log 2>&1
TESTS="env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider"
E8="--model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3"
( export CUDA_VISIBLE_DEVICES=0 NEED_SCALE=2 STEP_DIR=$OUT/lane0; mkdir -p $STEP_DIR; budget=400
  budget_step oquant_kernel 20 taskset -c 0-13 $TESTS tests/attention/test_triton_backend.py -k fp8_rows
  budget_step split_kernel 30 taskset -c 0-13 $TESTS tests/kernels/test_parts_rmsnorm.py -k ticket_path
  budget_step split_tokens 25 taskset -c 0-13 $TESTS tests/layers/test_split_parts_norm.py -k "engine and fp8"
  budget_step oquant_tokens 30 taskset -c 0-13 $TESTS tests/layers/test_fp8_input.py -k fp8_rows
  budget_step bf16_engine 60 taskset -c 0-13 python3 benchmarks/decode_throughput.py $E8 \
    --graph-variants PARASHIFT_SPLIT_PARTS_NORM=1 --output $OUT/bf16_b64.json
  budget_step split_timings 35 taskset -c 0-13 python3 benchmarks/split_parts_norm.py --rows 64 --no-dot-configs --output $OUT/split_timings.json
) > $OUT/lane0.out 2>&1 &
( export CUDA_VISIBLE_DEVICES=1; PYTHONPATH=.:/tmp/site timeout 420 taskset -c 14-27 python3 benchmarks/decode_throughput.py $E8 \
    --quantization fp8 --no-dot-configs \
    --graph-variants PARASHIFT_ATTN_O_FP8=1 PARASHIFT_SPLIT_PARTS_NORM=1 PARASHIFT_ATTN_O_FP8=1,PARASHIFT_SPLIT_PARTS_NORM=1 \
    --output $OUT/fp8_b64.json > $OUT/fp8_b64.log 2>&1 ) &
wait
cat $OUT/lane0.out | cut -c1-300
for f in $OUT/fp8_b64.json $OUT/bf16_b64.json; do [ -f $f ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('variants'), d.get('split_parts_norm')); print([(r.get('variant'), round(r['step_ms'],4), round(r['fraction_of_floor'],4)) for r in d['rows']])" $f; done
tail -3 $OUT/fp8_b64.log | cut -c1-300
