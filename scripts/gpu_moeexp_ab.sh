#!/usr/bin/env bash
# Issue 61 item 2 (helper moeexp): Qwen3-30B-A3B decode's expert kernels and the bf16 skinny
# choice, on ONE H200, in this order (what BUDGET_S leaves out last):
# 1. GPU tests: the decode-fused grouped path (moe_decode, against the unfused path and the
#    rounded reference), the small path and grouped path's bf16 cases, PDL's same bits, the
#    GEMM timing modes (the small and grouped paths' bf16 case tests after the decode runs);
# 2. benchmarks/moe_chain.py: 16 MoE layers (router + experts) in a CUDA graph, PDL on, at 1
#    and 64 tokens: the small path's tiles; the 64-token experts unfused against the fused
#    kernels at the default tiles, the first ones and others;
# 3. the 8B bf16 at b1 b64 (context 1024, graphs, max-model-len 8192, 32 steps): this tree
#    ("new": the GEMM choice timed in the decode chain), then PARASHIFT_GEMM_TIMING=flushed
#    ("old": the bf16 skinny choice as before);
# 4. Qwen3-30B-A3B decode b1 b64 the same way, new then old (PARASHIFT_MOE_DECODE_FUSED=0,
#    PARASHIFT_GEMM_TIMING=flushed), then MOE_EXTRA's env on top of new if set.
# Usage: OUT=dir [BUDGET_S=240] [MOE_EXTRA="PARASHIFT_GEMM_TIMING=graph"] bash scripts/gpu_moeexp_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-240}
MOE=benchmarks/shapes/qwen3-30b-a3b.json
DENSE=benchmarks/shapes/llama-3.1-8b.json
OLD="PARASHIFT_MOE_DECODE_FUSED=0 PARASHIFT_GEMM_TIMING=flushed"
source scripts/budget_step.sh
decode() {  # name, seconds, model, env assignments ("" for none), then batch sizes
  local name=$1 need=$2 model=$3 vars=$4; shift 4
  budget_step "$name" "$need" env $vars python3 benchmarks/decode_throughput.py \
    --model "$model" --max-model-len 8192 --context 1024 --decode-steps 32 --cuda-graphs \
    --output "$OUT/$name.json" --batch-sizes "$@"
}
budget_step tests 45 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  -k "not interpreted and (bfloat16 or not float)" \
  tests/kernels/test_moe_decode.py tests/kernels/test_gemm_timing.py \
  "tests/kernels/test_pdl.py::test_moe_decode_kernels_give_the_same_bits_with_pdl" \
  "tests/kernels/test_pdl.py::test_gemms_time_their_choice_with_pdl_suspended_unless_in_the_chain"
budget_step moe_chain 30 python3 benchmarks/moe_chain.py --model "$MOE" --tokens 1 64 \
  --layers 16 --output "$OUT/moe_chain.json"
decode dense_new 30 "$DENSE" "" 1 64
decode dense_old 30 "$DENSE" "PARASHIFT_GEMM_TIMING=flushed" 1 64
decode moe_new 50 "$MOE" "" 1 64 --profile
decode moe_old 45 "$MOE" "$OLD" 1 64
budget_step tests_more 60 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider -k "bfloat16" "tests/kernels/test_moe_small.py::test_cuda" \
  "tests/kernels/test_fused_moe.py::test_cuda"
[ -n "${MOE_EXTRA:-}" ] && decode moe_extra 45 "$MOE" "$MOE_EXTRA" 1 64
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = f"{out}/{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None
for r in (load("moe_chain") or {}).get("rows", []):
    print(f"chain {r['tokens']} tokens, floor {r['floor_us']} us/layer: " + ", ".join(
        f"{k} {v} ({r['fraction'].get(k, '-')})" for k, v in r["us"].items()))
for name in ("moe_new", "moe_old", "moe_extra", "dense_new", "dense_old"):
    d = load(name)
    if d:
        print(name, [(r["batch"], round(r["step_ms"], 3), round(r["fraction_of_floor"], 3))
                     for r in d["rows"]], [(s["weight"], s["rows"], s["kernel"])
                                           for s in d.get("skinny_gemm", [])])
PY
