#!/usr/bin/env bash
# Deterministic mode's decode attention on one GPU (issue 22, eleventh session): the kernel
# tests on CUDA (decodes bit-equal to prefill rows), the cost against the default mode, and
# the decode step with decodes in the prefill configuration (before) beside the 16-row one.
# From the repository root, with the wheels of scripts/fetch_gpu_wheels.sh on PYTHONPATH:
#   OUT=dir bash scripts/gpu_det_decode.sh
set -u
E=benchmarks/shapes/llama-3.1-8b.json
echo "== tests $(date +%T)"
PARASHIFT_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/deterministic/test_kernels.py -k "attention" 2>&1 | tail -5
PARASHIFT_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider tests/deterministic/test_batch_invariance.py 2>&1 | tail -3
echo "== cost $(date +%T)"
timeout 150 python3 benchmarks/deterministic.py --skip-matrix --models $E --out $OUT/det_cost_small.jsonl 2>&1 | grep '^{' | cut -c1-300
echo "== before (decodes in the prefill configuration) $(date +%T)"
PARASHIFT_DETERMINISTIC_DECODE_ATTENTION=prefill timeout 90 python3 benchmarks/decode_throughput.py --model $E --batch-sizes 1 64 256 --context 512 --decode-steps 16 --deterministic --output $OUT/det_decode_prefillcfg.json 2>&1 | grep '^{"batch' | cut -c1-200
timeout 90 python3 benchmarks/decode_throughput.py --model $E --batch-sizes 1 64 256 --context 512 --decode-steps 16 --deterministic --output $OUT/det_decode_small.json 2>&1 | grep '^{"batch' | cut -c1-200
echo "== end $(date +%T)"
