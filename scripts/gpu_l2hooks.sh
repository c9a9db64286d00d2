#!/usr/bin/env bash
# Helper l2hooks (issues 60, 61), one H200: the L2 prefetch called from the decoder blocks
# (no forward hooks), its per-model default (Qwen3-MoE off), the dead switches removed.
# STEPS (default "host decode_fp8 tests decode_moe"), in order, each a `budget_step` within
# BUDGET_S (default 150) seconds, results to $OUT as they come:
#   tests: the GPU tests of the kernels changed (the one-launch decode attention; the dense
#     TMA GEMM; PDL bits); engine_tests: the engine's greedy tokens with the prefetch and
#     without, bf16 and FP8 (tests/layers/test_l2_prefetch.py);
#   host: benchmarks/l2_prefetch_host.py: µs a call adds (--per-call), then a 512-token
#     prefill step's host time, 8B bf16, the blocks' calls against forward hooks against
#     neither;
#   decode_fp8 / decode_bf16: the 8B engine's decode b1, default (on) against
#     PARASHIFT_L2_PREFETCH=0 (graph variants, DECODE_ROUNDS rounds);
#   decode_moe: Qwen3-30B-A3B's, built with PARASHIFT_L2_PREFETCH=1 (its default is now off)
#     against =0;
#   (norm_gemv_chain: removed in session 51 with the norm-in-GEMV path.)
# Usage: OUT=dir [BUDGET_S=150] [STEPS="..."] [DECODE_ROUNDS=2] [HOST_ROUNDS=4]
#   bash scripts/gpu_l2hooks.sh
set -u
out=${OUT:?an output folder}
budget=${BUDGET_S:-150}
rounds=${DECODE_ROUNDS:-2}
source "$(dirname "$0")/budget_step.sh"
decode() {  # NAME NEED SHAPE [decode_throughput options]
  local name=$1 need=$2 shape=$3; shift 3
  budget_step "$name" "$need" python3 benchmarks/decode_throughput.py --model "$shape" \
    --batch-sizes 1 --context 1024 --decode-steps 32 --cuda-graphs --no-dot-configs \
    --rounds "$rounds" --graph-variants PARASHIFT_L2_PREFETCH=0 --output "$out/$name.json" "$@"
}
step_tests() {  # the kernels' and launches' GPU tests of what changed
  budget_step tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -rfE \
    -p no:cacheprovider tests/kernels/test_dense_gemm_tma.py \
    tests/attention/test_triton_backend.py tests/kernels/test_pdl.py \
    -k "dense_gemm_tma or fused_decode or pdl_kv_write or decode_attention or rotary_and_attention"
}
step_engine_tests() {  # the engine's greedy tokens with the prefetch and without
  budget_step engine_tests 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -rfE \
    -p no:cacheprovider tests/layers/test_l2_prefetch.py
}
step_host() {
  budget_step per_call 10 python3 benchmarks/l2_prefetch_host.py --per-call
  budget_step host 35 python3 benchmarks/l2_prefetch_host.py --prompt-len 512 \
    --rounds "${HOST_ROUNDS:-4}" \
    --repeats 5 --output "$out/host.json"
}
step_decode_fp8() { decode decode_fp8 45 benchmarks/shapes/llama-3.1-8b.json --quantization fp8; }
step_decode_bf16() { decode decode_bf16 30 benchmarks/shapes/llama-3.1-8b.json; }
step_decode_moe() {
  PARASHIFT_L2_PREFETCH=1 decode decode_moe 55 benchmarks/shapes/qwen3-30b-a3b.json \
    --max-model-len 8192
}
for step in ${STEPS:-host decode_fp8 tests decode_moe}; do
  "step_$step"
done
python3 - "$out" <<'PY' 2>&1 | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]
print(open(f"{out}/per_call.log").read().strip() if os.path.exists(f"{out}/per_call.log") else "")
for name in ("host", "decode_fp8", "decode_moe", "decode_bf16"):
    path = f"{out}/{name}.json"
    if not os.path.exists(path):
        continue
    d = json.load(open(path))
    for row in d.get("variants") or d.get("rows", []):
        print(name, json.dumps(row))
PY
