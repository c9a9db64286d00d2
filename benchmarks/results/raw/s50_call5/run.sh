#!/usr/bin/env bash
# Session 50's fifth call (x2): helper qkvparts (QKV's split-K parts summed by the rotary +
# KV-write kernel, PARASHIFT_SPLIT_PARTS_ROTARY). Lane 0: its GPU tests, the pair's timings,
# the 8B bf16 b64 A/B; lane 1: the 8B FP8 b64 A/B.
set -u
export PYTHONUNBUFFERED=1
source scripts/budget_step.sh
PYTHONPATH=.:/tmp/site python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 28 > $OUT/warm.log 2>&1
TESTS="env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider"
E8="--model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3 --graph-variants PARASHIFT_SPLIT_PARTS_ROTARY=1"
( export CUDA_VISIBLE_DEVICES=0 STEP_DIR=$OUT/lane0; mkdir -p $STEP_DIR; budget=480
  budget_step kernel_tests 40 taskset -c 0-13 $TESTS tests/kernels/test_parts_rotary.py
  budget_step engine_tokens 75 taskset -c 0-13 $TESTS tests/layers/test_split_parts_rotary.py -k "engine"
  budget_step timings 40 taskset -c 0-13 python3 benchmarks/split_parts_rotary.py --rows 64 --no-dot-configs --output $OUT/timings.json
  budget_step engine_bf16 100 taskset -c 0-13 python3 benchmarks/decode_throughput.py $E8 --output $OUT/bf16.json
) > $OUT/lane0.out 2>&1 &
( export CUDA_VISIBLE_DEVICES=1; PYTHONPATH=.:/tmp/site timeout 300 taskset -c 14-27 python3 benchmarks/decode_throughput.py $E8 \
    --quantization fp8 --no-dot-configs --output $OUT/fp8.json > $OUT/fp8.log 2>&1 ) &
wait
cat $OUT/lane0.out | cut -c1-300
grep -h '^{"pair"' $OUT/lane0/timings.log 2>/dev/null | cut -c1-600
for f in $OUT/bf16.json $OUT/fp8.json; do [ -f $f ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('split_parts_rotary')); print([(r['batch'], r.get('variant'), round(r['step_ms'],4), round(r['fraction_of_floor'],4)) for r in d['rows']])" $f; done
tail -n 3 $OUT/fp8.log | cut -c1-300
