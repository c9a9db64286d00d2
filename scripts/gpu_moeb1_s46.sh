#!/usr/bin/env bash
# Usage: OUT=dir bash scripts/gpu_moeb1_s46.sh (as READY_FOR_GPU ran it in session 46's third call)
# Helper moeb1 (session 46, issue 61 item 2), third call, ONE H200: Qwen3-30B-A3B decode at
# b1 with the post-attention norm + router in one launch on by default (the next norm in the
# down kernel and the evict-first switch removed: slower). 1) the engine at b1 (one start-up,
# graph variants in 3 rounds, alternating): the default against PARASHIFT_MOE_NORM_ROUTER=0
# (the tree before) and the L2 prefetch off on the MoE; the kernel breakdown of the default
# with PDL on and off; 2) the GPU tests of the new code (the engine's greedy tokens at b1 with
# the fused launch and without, the kernel against the PyTorch path); 3) if time is left, an
# engine with PARASHIFT_NORM_IN_GEMV=1 (one round, beside 1)'s default).
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=150
MOE=benchmarks/shapes/qwen3-30b-a3b.json
source scripts/budget_step.sh
budget_step engine 65 python3 benchmarks/decode_throughput.py --model "$MOE" \
  --max-model-len 8192 --context 1024 --decode-steps 32 --cuda-graphs --batch-sizes 1 \
  --profile --rounds 3 --graph-variants PARASHIFT_MOE_NORM_ROUTER=0 PARASHIFT_PDL=0 \
  PARASHIFT_L2_PREFETCH=0 --profile-variants default PARASHIFT_PDL=0 \
  --output "$OUT/engine.json"
budget_step tests 35 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -rA -p no:cacheprovider \
  tests/kernels/test_moe_norm_router.py tests/layers/test_norm_router.py
# 3) (the norm-in-GEMV engine: removed in session 51 with PARASHIFT_NORM_IN_GEMV)
python3 - "$OUT" <<'EOF' 2>&1 | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
if os.path.exists(f"{out}/engine.json"):
    d = json.load(open(f"{out}/engine.json"))
    rows = d["rows"]
    for v in d.get("variants", []):
        print(v, round(rows[0]["floor_ms"] / v["step_ms"], 4))
else:  # cut short: the rows printed so far
    rows = [json.loads(line) for line in open(f"{out}/engine.log") if line.startswith('{"batch"')]
for r in rows:
    print(r.get("variant"), r.get("round"), round(r["step_ms"], 4))
    p = r.get("profile")
    if p:
        for k in p["top_launches"][:12]:
            print("   ", k["kernel"][:60], k["mean_us"], k["calls"])
EOF
