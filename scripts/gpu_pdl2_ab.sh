#!/usr/bin/env bash
# Issues 60 and 61 (item 3), round 2: where a kernel lets its dependents launch under PDL
# (PARASHIFT_PDL=1|early: right after its wait; late: once its inputs are read) and how much
# of its weight a GEMM program prefetches before its wait (PARASHIFT_PDL_PREFETCH_KB), on ONE
# Hopper GPU, in this order (what BUDGET_S leaves out last):
# 1. a fast subset of the GPU same-bits tests of tests/kernels/test_pdl.py (off against early
#    and late: rotary and attention eagerly, norm, GEMMs, SiLU-and-mul and quantization in a
#    CUDA graph of a decode chain; the chain below compares every variant's bits too);
# 2. benchmarks/pdl_chain.py: 32 layers of the 8B shape's decode kernels in a CUDA graph, off
#    against early:16 early:0 late:16 late:0 (PLACEMENT:KB), bf16 and FP8, b1 and b64;
# 3. benchmarks/decode_throughput.py, 8B shape, b1 and b64, context 1024, CUDA graphs: bf16
#    then FP8, each with PDL off and the two variants the chain found fastest (the mean of
#    off / variant over its four rows; DECODE_VARIANTS="late:16 late:0" picks them instead),
#    one round: bf16 and FP8 off, then with the best, then with the second;
# 4. where time is left: an engine's greedy tokens and logprobs the same off, early and late.
# Then ONE summary on stdout: every step's rc and seconds, the chain's µs a layer by variant,
# the decode step times and fractions of the floor with the ratio off / variant (> 1: PDL
# faster), the GEMM kernels each run chose (they are timed per process, with PDL off) and,
# for bf16, the top kernels of a step (--profile, after the timed steps).
# $OUT gets at most 4 files: summary.txt, pdl_chain.json, decode.json (every run), and
# failures.log (the end of each failed step's log); the logs stay in $WORK.
# Usage (repository root; wheels of scripts/fetch_gpu_wheels.sh on PYTHONPATH where the
# image lacks one): OUT=dir [BUDGET_S=220] [DECODE_VARIANTS="late:16 late:0"]
#   bash scripts/gpu_pdl2_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-220}
WORK=${WORK:-$(mktemp -d /tmp/pdl2_ab.XXXX)}
S=$(pwd)/benchmarks/shapes
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, triton; from parashift.kernels import pdl; print('torch', \
torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), \
torch.cuda.get_device_capability(), 'triton has PDL', pdl.triton_supports())" \
  > "$WORK/versions.log" 2>&1
source scripts/budget_step.sh
export STEP_DIR=$WORK FAILURES_LOG=$OUT/failures.log
step() {  # name, PARASHIFT_PDL, PARASHIFT_PDL_PREFETCH_KB, seconds it needs, the command
  local name=$1 flag=$2 kb=$3 need=$4; shift 4
  budget_step "$name" "$need" env PARASHIFT_PDL="$flag" PARASHIFT_PDL_PREFETCH_KB="$kb" "$@"
}
decode() {  # weights (bf16 | fp8), PARASHIFT_PDL, PARASHIFT_PDL_PREFETCH_KB
  local quant=(--profile) name="decode_$1_$2_$3"  # bf16: the kernels a step runs, after timing
  [ "$1" = fp8 ] && quant=(--quantization fp8)
  step "$name" "$2" "$3" 30 python3 benchmarks/decode_throughput.py --model "$S/llama-3.1-8b.json" \
    --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs ${quant[@]+"${quant[@]}"} \
    --output "$WORK/$name.json"
}
step pdl_tests 0 16 35 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  -k "graph_of_a_decode_chain or rotary_and_attention" tests/kernels/test_pdl.py
step pdl_chain 0 16 45 python3 benchmarks/pdl_chain.py --repeats 15 \
  --variants early:16 early:0 late:16 late:0 --output "$WORK/pdl_chain.json"
[ -f "$WORK/pdl_chain.json" ] && cp "$WORK/pdl_chain.json" "$OUT/"
variants=${DECODE_VARIANTS:-$(python3 - "$WORK/pdl_chain.json" <<'PY'
import json, os, statistics, sys
path = sys.argv[1]
if not os.path.exists(path):
    print("late:16 late:0")
    raise SystemExit
rows = json.load(open(path))["rows"]
names = [n for n in rows[0]["variants"] if n != "off"]
score = {n: statistics.fmean(r["variants"]["off"]["us_per_layer"] / r["variants"][n]["us_per_layer"]
                             for r in rows) for n in names}
best = sorted(names, key=lambda n: -score[n])[:2]
print(" ".join(n.replace("_prefetch_", ":").removesuffix("kb") for n in best))
PY
)}
echo "decode variants: $variants" >> "$WORK/steps"
set -- ${variants:-late:16 late:0}  # bf16 and FP8 off and the best first, then the second: the budget's cut
for v in 0:16 "$1"; do for weights in bf16 fp8; do decode $weights "${v%%:*}" "${v##*:}"; done; done
[ -n "${2:-}" ] && for weights in bf16 fp8; do decode $weights "${2%%:*}" "${2##*:}"; done
step engine_tests 0 16 70 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  -k engine tests/kernels/test_pdl.py
python3 - "$WORK" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, sys
work, out = sys.argv[1:]
versions = open(f"{work}/versions.log").read().strip().splitlines() or ["?"]
print("== pdl2 A/B:", versions[-1][:300])
steps = f"{work}/steps"
for line in open(steps) if os.path.exists(steps) else []:
    print("  step", line.strip())
chain = f"{work}/pdl_chain.json"
if os.path.exists(chain):
    doc = json.load(open(chain))
    print(f"== pdl_chain, us/layer (copy {doc['copy_bandwidth_tb_s']:.2f} TB/s; off/variant)")
    for r in doc["rows"]:
        off = r["variants"]["off"]["us_per_layer"]
        each = " ".join(f"{n.replace('_prefetch_', ':')} {v['us_per_layer']} ({off / v['us_per_layer']:.3f})"
                        for n, v in r["variants"].items() if n != "off")
        print(f"  {r['weights']} b{r['batch']}: off {off} ({r['off_floor_fraction_4p8']} of 4.8 TB/s)"
              f" | {each} | same bits {r['same_bits']} pdl {r['pdl_enabled']}")
        print("    chose:", "; ".join(f"{c.get('rows', c.get('rows_up_to'))}x{c['weight']} "
                                     f"{c['kernel']}" for c in r["chosen"]))
runs, docs = {}, {}
for path in sorted(glob.glob(f"{work}/decode_*.json")):
    _, weights, flag, kb = os.path.basename(path)[:-5].split("_")
    docs[os.path.basename(path)[:-5]] = doc = json.load(open(path))
    runs[weights, f"{flag}:{kb}"] = doc
json.dump(docs, open(f"{out}/decode.json", "w"), indent=1)
print("== decode_throughput 8B, context 1024, CUDA graphs, one round (ms; fraction of floor; off/variant)")
for weights in ("bf16", "fp8"):
    off = runs.get((weights, "0:16"))
    for setting, doc in sorted((k[1], v) for k, v in runs.items() if k[0] == weights):
        for r in doc["rows"]:
            ref = next((o for o in (off or {"rows": []})["rows"] if o["batch"] == r["batch"]), None)
            ratio = f"{ref['step_ms'] / r['step_ms']:.3f}x" if ref and setting != "0:16" else "-"
            print(f"  {weights} b{r['batch']} PDL {setting}: {r['step_ms']:.3f} ms "
                  f"({r['fraction_of_floor']:.3f}) {ratio} pdl_on={doc.get('pdl')}")
        chosen = [c for c in doc.get("skinny_gemm", []) if c["rows"] == 1] + \
                 [c for c in doc.get("fp8_gemm", []) if c["rows_up_to"] in (1, 64)]
        print(f"    {weights} PDL {setting} chose:", "; ".join(
            f"{c.get('rows', c.get('rows_up_to'))}x{c['weight']} {c['kernel']}" for c in chosen))
        for r in doc["rows"]:
            p = r.get("profile")
            if p:  # ms a step of the kernels (under PDL a kernel's span includes its wait)
                print(f"    b{r['batch']} profile: busy {p['gpu_busy_ms']:.3f} span "
                      f"{p['kernel_span_ms']:.3f} gaps>8us {p['idle_gaps_over_8us_ms']:.3f} |",
                      "; ".join(f"{n[:60]} {t}" for n, t in p["top_kernels"][:12]))
PY
