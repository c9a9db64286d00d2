#!/usr/bin/env bash
# Issue 4's runs on nvidia-h200-x2 (2 GPUs), JSON to $OUT. Step 1: NCCL + CUDA-graph
# correctness of the 2-rank plans; 2: the SP2 vs shift-plan crossover (sets the shift
# threshold used in 3); 3: the Figure 9 table (interactive TTFT/TPOT, batch throughput).
# Usage: OUT=dir bash scripts/gpu_shift_runs.sh MODEL_JSON INTERACTIVE BATCH [TESTS=1]
set -u
model=${1:-benchmarks/shapes/llama-3.1-8b.json}; interactive=${2:-20}; batch=${3:-1000}
name=$(basename "$model" .json)
if [ "${4:-1}" = 1 ]; then
  PARASHIFT_TEST_DEVICE=cuda PARASHIFT_TEST_CUDA_GRAPHS=1 python3 -m pytest -q -x \
    tests/distributed/test_plans.py tests/distributed/test_shift.py -k "tp2 or sp2" 2>&1 | tail -3
fi
python3 benchmarks/shift_crossover.py --model "$model" -sp 2 --tokens 1 8 32 64 128 256 512 \
  --prefill-tokens 1024 2048 4096 8192 --steps 6 --cuda-graphs --output "$OUT/crossover_$name.json" 2>&1 | grep -E '^\{|suggested'
threshold=$(python3 -c "import json; print(json.load(open('$OUT/crossover_$name.json'))['suggested_threshold'])")
python3 benchmarks/plans.py --model "$model" --plans single tp2 dp2 sp2 shift2 \
  --interactive-requests "$interactive" --batch-requests "$batch" --cuda-graphs \
  --shift-threshold "$threshold" --output "$OUT/plans_$name.json" 2>&1 | grep '^{'
