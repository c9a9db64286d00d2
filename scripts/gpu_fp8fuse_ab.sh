#!/usr/bin/env bash
# Issue 60, FP8 activations quantized by the op before (layers/fp8_input.py), on ONE GPU:
# 1. the GPU tests of the fused kernels (RMSNorm and SiLU-and-mul with E4M3 rows, bit for bit
#    the unfused pair), of the GEMM taking them, and the FP8 engine's tokens and logprobs with
#    and without them;
# 2. 8B-shape FP8 decode (b1, b64, with a kernel profile) and prefill 4096 of $BEFORE's tree and
#    this one, interleaved (decode before, after; prefill after, before);
# 3. if time is left: bf16 prefill 4096 (this tree; the FP8 / bf16 ratio), and the fused kernels
#    against the unfused pairs (benchmarks/fp8_fused_input.py).
# A step is skipped where its usual time would pass BUDGET_S (default 330) seconds (tests ~90,
# a decode run ~75, a prefill run ~50); a summary at the end.
# JSON and logs to $OUT/<step>.{json,log}.
# From the repository root, $BEFORE an earlier tree unpacked inside it (e.g. `git archive
# <main's commit> | tar -x -C .before`, carried with it), wheels of scripts/fetch_gpu_wheels.sh
# on PYTHONPATH where the image lacks one:
# Usage: OUT=dir BEFORE=.before [BUDGET_S=330] bash scripts/gpu_fp8fuse_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export PARASHIFT_FP8_FUSED_INPUT=1  # the current tree's fusion (off by default until measured)
here=$(pwd); before=${BEFORE:?the earlier tree}; budget=${BUDGET_S:-330}
S=$here/benchmarks/shapes
step() {  # name, tree (before|after), seconds it needs, then the command
  local name=$1 tree=$2 need=$3; shift 3
  if [ $((SECONDS + need)) -gt "$budget" ]; then echo "[$name skipped: $SECONDS s used]"; return; fi
  local dir=$here start=$SECONDS limit=$((budget - SECONDS))
  [ "$tree" = before ] && dir=$here/$before
  [ $limit -gt $((2 * need)) ] && limit=$((2 * need))  # a hung step leaves time to the others
  (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" timeout $limit "$@" \
    > "$OUT/$name.log" 2>&1)
  echo "[$name: rc=$? $((SECONDS - start)) s] $(tail -1 "$OUT/$name.log" | cut -c1-160)"
}
tests="tests/kernels/test_rmsnorm.py tests/kernels/test_silu_mul.py tests/layers/test_fp8_input.py
  tests/kernels/test_fp8_gemm.py::test_rows_quantized_before_are_taken_where_the_choice_quantizes"
step gpu_tests after 90 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  -k "not interpreted" $tests
decode() { step "decode_$1" "$1" 75 python3 benchmarks/decode_throughput.py \
  --model "$S/llama-3.1-8b.json" --batch-sizes 1 64 --context 1024 --decode-steps 32 \
  --quantization fp8 --profile --output "$OUT/decode_$1.json"; }
prefill() { step "prefill_$1" "$2" 50 python3 benchmarks/prefill_throughput.py \
  --model "$S/llama-3.1-8b.json" --prompt-lens 4096 --repeats 3 $3 --output "$OUT/prefill_$1.json"; }
fits() { [ $((SECONDS + $1)) -le "$budget" ] || { echo "[$2 skipped: $SECONDS s used]"; false; }; }
if fits 150 "decode pair"; then decode before; decode after; fi
if fits 100 "prefill pair"; then
  prefill after after "--quantization fp8"; prefill before before "--quantization fp8"
fi
prefill bf16 after ""
step fused_kernels after 30 python3 benchmarks/fp8_fused_input.py --output "$OUT/fused_kernels.json"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = f"{out}/{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None
decode = {tree: load(f"decode_{tree}") for tree in ("before", "after")}
for tree, doc in decode.items():
    for r in (doc or {}).get("rows", []):
        kernels = (r.get("profile") or {}).get("top_kernels", [])
        fp8_in = [f"{n[:40]} {t}" for n, t in kernels if "quantize" in n or "rms_norm" in n
                  or "silu" in n]
        print(f"decode {tree:6s} b{r['batch']}: {r['step_ms']:.3f} ms, "
              f"{r['fraction_of_floor']:.3f} of floor | {'; '.join(fp8_in)}")
if all(decode.values()):
    for b, a in zip(decode["before"]["rows"], decode["after"]["rows"]):
        print(f"decode b{a['batch']}: before/after step {b['step_ms'] / a['step_ms']:.3f}x")
prefill = {name: load(f"prefill_{name}") for name in ("before", "after", "bf16")}
for name, doc in prefill.items():
    for r in (doc or {}).get("rows", []):
        print(f"prefill {name:6s} {r['prompt_len']}: {r['tokens_per_s']:.0f} tokens/s")
if prefill["after"] and prefill["before"]:
    a, b = (prefill[n]["rows"][0]["tokens_per_s"] for n in ("after", "before"))
    print(f"prefill FP8 after/before: {a / b:.3f}x")
    if prefill["bf16"]:
        bf16 = prefill["bf16"]["rows"][0]["tokens_per_s"]
        print(f"prefill FP8 / bf16: before {b / bf16:.3f}x, after {a / bf16:.3f}x")
for r in (load("fused_kernels") or {}).get("rows", []):
    print("kernels", json.dumps(r))
PY
