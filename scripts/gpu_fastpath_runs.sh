#!/usr/bin/env bash
# Issue 6's one-GPU runs (nvidia-h200), JSON to $OUT: the GPU correctness tests of the fast
# path, then decode, prefill, offline throughput and the transformers side-by-side, all on the
# Llama-3.1-8B shape. The SmolLM2 tests need the embedded GGUF installed (README, "GPU runs").
# Usage: OUT=dir bash scripts/gpu_fastpath_runs.sh [NUM_REQUESTS=200]
set -u
model=benchmarks/shapes/llama-3.1-8b.json; num=${1:-200}
python3 -m pytest -q tests/kernels tests/attention tests/engine/test_gpu_engine.py 2>&1 | tail -3
python3 benchmarks/skinny_gemm.py --model $model --rows 1 2 4 2>&1 | grep '^{' | cut -c1-300
python3 benchmarks/decode_throughput.py --model $model --batch-sizes 1 16 64 256 --max-model-len 8192 \
  --decode-steps 32 --cuda-graphs --profile --output "$OUT/decode.json" 2>&1 | grep '^{"batch' | cut -c1-400
python3 benchmarks/prefill_throughput.py --model $model --prompt-lens 512 4096 \
  --output "$OUT/prefill.json" 2>&1 | grep '^{'
python3 benchmarks/hf_compare.py --model $model --num-prompts 64 --output-len 256 --cuda-graphs \
  --output "$OUT/hf.json" 2>&1 | tail -1
for workload in chat batch; do
  python3 -m parashift.cli bench throughput --workload $workload --num-requests "$num" \
    --model $model --skip-tokenizer-init --dtype bfloat16 --cuda-graphs --max-model-len 8192 \
    --output-json "$OUT/throughput_$workload.json" 2>&1 | grep requests
done
