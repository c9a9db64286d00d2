#!/usr/bin/env bash
# Session 50's third call (x2): lane 0 the GPU tests of the session's defaults (split parts,
# bf16 gated gate_up) and the engine's graph test; lane 1 the claims: 8B bf16 b1/b64 with the
# session's two defaults against both off (graph variants in one engine, 3 rounds in turn),
# then 8B FP8 b1/b64 (3 rounds).
set -u
export PYTHONUNBUFFERED=1
source scripts/budget_step.sh
PYTHONPATH=.:/tmp/site python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 28 > $OUT/warm.log 2>&1
TESTS="env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider"
E8="--model benchmarks/shapes/llama-3.1-8b.json --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 3"
( export CUDA_VISIBLE_DEVICES=0 STEP_DIR=$OUT/lane0; mkdir -p $STEP_DIR; budget=520
  budget_step split_tokens 150 taskset -c 0-13 $TESTS tests/layers/test_split_parts_norm.py -k engine
  budget_step split_kernels 100 taskset -c 0-13 $TESTS tests/kernels/test_parts_rmsnorm.py
  budget_step gated_layer 60 taskset -c 0-13 $TESTS tests/layers/test_dense_gated_silu.py
  budget_step gpu_engine 60 taskset -c 0-13 $TESTS tests/engine/test_gpu_engine.py -k graphs
) > $OUT/lane0.out 2>&1 &
( export CUDA_VISIBLE_DEVICES=1; cd . 
  PYTHONPATH=.:/tmp/site timeout 260 taskset -c 14-27 python3 benchmarks/decode_throughput.py $E8 \
    --graph-variants PARASHIFT_SPLIT_PARTS_NORM=0,PARASHIFT_DENSE_GATE_UP_SILU=0 --output $OUT/bf16.json > $OUT/bf16.log 2>&1
  PYTHONPATH=.:/tmp/site timeout 260 taskset -c 14-27 python3 benchmarks/decode_throughput.py $E8 \
    --quantization fp8 --no-dot-configs --graph-variants PARASHIFT_SPLIT_PARTS_NORM=0 --output $OUT/fp8.json > $OUT/fp8.log 2>&1
) &
wait
cat $OUT/lane0.out | cut -c1-300
for f in $OUT/bf16.json $OUT/fp8.json; do [ -f $f ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('variants'), d.get('split_parts_norm'), d.get('dense_gated')); print([(r['batch'], r.get('variant'), round(r['step_ms'],4), round(r['fraction_of_floor'],4)) for r in d['rows']])" $f; done
tail -2 $OUT/bf16.log $OUT/fp8.log | cut -c1-300
