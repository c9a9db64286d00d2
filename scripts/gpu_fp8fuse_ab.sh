#!/usr/bin/env bash
# Issue 60, FP8 activations quantized by the op before (layers/fp8_input.py), on ONE GPU,
# by PARASHIFT_FP8_FUSED_INPUT mode of this tree: 0 (none, as before the fusion), norm (the
# RMSNorms), 1 (the RMSNorms and SiLU-and-mul), in this order (what BUDGET_S leaves out last):
# 1. the GPU tests of the fused kernels (RMSNorm and SiLU-and-mul with E4M3 rows, bit for bit
#    the unfused pair; the split SiLU kernel launch after launch) and of the GEMM taking them;
# 2. the fused kernels against the unfused pairs alone (benchmarks/fp8_fused_input.py);
# 3. 8B-shape FP8 decode (b1, b64, with a kernel profile), modes 0 then 1, and prefill 4096,
#    modes 1 then 0;
# 4. the FP8 engine's greedy tokens and logprobs with and without the fusion (GPU test);
# 5. decode and prefill in mode norm.
# A step is skipped where its usual time would pass BUDGET_S seconds (tests ~40, kernels ~30,
# the engine test ~50, a decode run ~75, a prefill run ~50): the default 330 reaches 3, 560
# all five. A summary at the end; JSON and logs to $OUT/<step>.{json,log}.
# From the repository root, wheels of scripts/fetch_gpu_wheels.sh on PYTHONPATH where the
# image lacks one:
# Usage: OUT=dir [BUDGET_S=330] bash scripts/gpu_fp8fuse_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-330}
S=$(pwd)/benchmarks/shapes
source scripts/budget_step.sh
step() {  # name, PARASHIFT_FP8_FUSED_INPUT, seconds it needs, then the command
  local name=$1 mode=$2 need=$3; shift 3
  budget_step "$name" "$need" env PARASHIFT_FP8_FUSED_INPUT="$mode" "$@"
}
gpu_tests() {  # name, seconds, then the tests
  local name=$1 need=$2; shift 2
  step "$name" 0 "$need" env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
    -p no:cacheprovider -k "not interpreted" "$@"
}
decode() { step "decode_$1" "$1" 75 python3 benchmarks/decode_throughput.py \
  --model "$S/llama-3.1-8b.json" --batch-sizes 1 64 --context 1024 --decode-steps 32 \
  --quantization fp8 --profile --output "$OUT/decode_$1.json"; }
prefill() { step "prefill_$1" "$1" 50 python3 benchmarks/prefill_throughput.py \
  --model "$S/llama-3.1-8b.json" --prompt-lens 4096 --repeats 3 --quantization fp8 \
  --output "$OUT/prefill_$1.json"; }
gpu_tests kernel_tests 40 tests/kernels/test_rmsnorm.py tests/kernels/test_silu_mul.py \
  tests/kernels/test_fp8_gemm.py::test_rows_quantized_before_are_taken_where_the_choice_quantizes \
  tests/kernels/test_fp8_gemm.py::test_rows_quantized_in_one_kernel_match_torch
step fused_kernels 0 30 python3 benchmarks/fp8_fused_input.py --output "$OUT/fused_kernels.json"
decode 0; decode 1; prefill 1; prefill 0
gpu_tests engine_test 50 tests/layers/test_fp8_input.py
decode norm; prefill norm
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
MODES = ("0", "norm", "1")
def load(name):
    path = f"{out}/{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None
decode = {mode: load(f"decode_{mode}") for mode in MODES}
for mode, doc in decode.items():
    for r in (doc or {}).get("rows", []):
        kernels = (r.get("profile") or {}).get("top_kernels", [])
        fp8_in = [f"{n[:40]} {t}" for n, t in kernels if "quantize" in n or "rms_norm" in n
                  or "silu" in n]
        print(f"decode {mode:4s} b{r['batch']}: {r['step_ms']:.3f} ms, "
              f"{r['fraction_of_floor']:.3f} of floor | {'; '.join(fp8_in)}")
for mode in ("norm", "1"):
    if decode["0"] and decode[mode]:
        for b, a in zip(decode["0"]["rows"], decode[mode]["rows"]):
            print(f"decode b{a['batch']}: step of 0 / of {mode} {b['step_ms'] / a['step_ms']:.3f}x"
                  " (> 1: fused faster)")
prefill = {mode: load(f"prefill_{mode}") for mode in MODES}
for mode, doc in prefill.items():
    for r in (doc or {}).get("rows", []):
        print(f"prefill {mode:4s} {r['prompt_len']}: {r['tokens_per_s']:.0f} tokens/s")
for mode in ("norm", "1"):
    if prefill["0"] and prefill[mode]:
        a, b = (prefill[m]["rows"][0]["tokens_per_s"] for m in (mode, "0"))
        print(f"prefill tokens/s of {mode} / of 0: {a / b:.3f}x (> 1: fused faster)")
for r in (load("fused_kernels") or {}).get("rows", []):
    print("kernels", json.dumps(r))
PY
