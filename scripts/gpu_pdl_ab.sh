#!/usr/bin/env bash
# Issues 60 and 61 (item 3): programmatic dependent launch of the decode kernels
# (parashift/kernels/pdl.py, PARASHIFT_PDL=0|1), on ONE Hopper GPU, in this order (what
# BUDGET_S leaves out last):
# 1. the GPU tests of PDL: every touched kernel the same bits with PDL on and off, eagerly
#    and in a CUDA graph of a decode chain; a bf16 and an FP8 engine's greedy tokens and
#    logprobs the same (tests/kernels/test_pdl.py, PARASHIFT_TEST_DEVICE=cuda);
# 2. benchmarks/pdl_chain.py: 32 layers of the 8B shape's decode kernels in a CUDA graph,
#    PDL off against on, the GEMMs prefetching 16, 0 and 64 KB a program of their weights
#    before the wait (bf16 and FP8 weights, b1 and b64), interleaved replays;
# 3. benchmarks/decode_throughput.py, 8B shape, b1 and b64, context 1024, CUDA graphs: FP8
#    then bf16, PDL 0 then 1, twice over (interleaved);
# 4. the touched kernels' own GPU tests (against torch) with PDL on;
# then a summary: per step its rc; per (weights, batch) the step times with PDL 0 and 1, the
# fraction of the floor, and the ratio (> 1: PDL faster).
# A step is skipped where its usual time would pass BUDGET_S seconds (tests ~120, the chain
# ~120, a decode run ~55, the kernel tests ~90). JSON and logs to $OUT/<step>.{json,log}.
# STEPS names the parts to run (default all: "tests chain decode kernels"); ROUNDS the
# decode rounds (default 2).
# From the repository root, wheels of scripts/fetch_gpu_wheels.sh on PYTHONPATH where the
# image lacks one:
# Usage: OUT=dir [BUDGET_S=540] [STEPS="chain decode"] [ROUNDS=2] bash scripts/gpu_pdl_ab.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
budget=${BUDGET_S:-540}
steps=" ${STEPS:-tests chain decode kernels} "
wants() { [[ "$steps" == *" $1 "* ]]; }
S=$(pwd)/benchmarks/shapes
mkdir -p "$OUT"
PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import torch, triton; from parashift.kernels import pdl; print('torch', \
torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, \
torch.cuda.get_device_name(), 'capability', torch.cuda.get_device_capability(), \
'triton has PDL', pdl.triton_supports())" 2>&1 | tee "$OUT/versions.log"
source scripts/budget_step.sh
step() {  # name, PARASHIFT_PDL, seconds it needs, then the command
  local name=$1 flag=$2 need=$3; shift 3
  budget_step "$name" "$need" env PARASHIFT_PDL="$flag" "$@"
}
decode() {  # quantization (bf16 | fp8), PARASHIFT_PDL, round
  local quant=() name="decode_$1_pdl$2_r$3"
  [ "$1" = fp8 ] && quant=(--quantization fp8)
  step "$name" "$2" 55 python3 benchmarks/decode_throughput.py --model "$S/llama-3.1-8b.json" \
    --batch-sizes 1 64 --context 1024 --decode-steps 32 --cuda-graphs ${quant[@]+"${quant[@]}"} \
    --output "$OUT/$name.json"
}
wants tests && step pdl_tests 0 120 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider -rs tests/kernels/test_pdl.py
wants chain && step pdl_chain 0 120 python3 benchmarks/pdl_chain.py --output "$OUT/pdl_chain.json"
if wants decode; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for quant in fp8 bf16; do decode $quant 0 $round; decode $quant 1 $round; done
  done
fi
wants kernels && step kernel_tests_pdl1 1 90 python3 -m pytest -q -p no:cacheprovider -k "not interpreted" \
  tests/kernels/test_rmsnorm.py tests/kernels/test_silu_mul.py tests/kernels/test_rotary.py \
  tests/kernels/test_fp8_gemv.py tests/kernels/test_skinny_gemm.py tests/kernels/test_fp8_gemm.py \
  tests/attention/test_triton_backend.py
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
print("== steps")
for path in sorted(glob.glob(f"{out}/*.rc")):
    print(f"  {os.path.basename(path)[:-3]}: rc={open(path).read().strip()}")
chain = f"{out}/pdl_chain.json"
if os.path.exists(chain):
    doc = json.load(open(chain))
    print(f"== pdl_chain ({doc['device']}, copy {doc['copy_bandwidth_tb_s']:.2f} TB/s)")
    for r in doc["rows"]:
        print(f"  {r['weights']} b{r['batch']}: off {r['off_us_per_layer']} us/layer "
              f"({r['off_floor_fraction_4p8']} of the 4.8 TB/s floor), on "
              f"{r['on_us_per_layer']} ({r['on_floor_fraction_4p8']}); on speedup "
              f"{r['speedup_on']}x; same bits {r['same_bits']}; pdl on {r['pdl_enabled']}")
        print("    us/layer by variant (prefetch KB a GEMM program):",
              {k: v["us_per_layer"] for k, v in r["variants"].items()})
runs = {}
for path in glob.glob(f"{out}/decode_*_pdl*_r*.json"):
    _, quant, flag, _ = os.path.basename(path)[:-5].split("_")
    for r in json.load(open(path))["rows"]:
        runs.setdefault((quant, r["batch"], flag[3:]), []).append(r)
print("== decode_throughput (8B, context 1024, CUDA graphs; medians over rounds)")
for quant in ("fp8", "bf16"):
    for batch in (1, 64):
        got = {flag: runs.get((quant, batch, flag), []) for flag in ("0", "1")}
        if not all(got.values()):
            continue
        ms = {f: statistics.median(r["step_ms"] for r in rs) for f, rs in got.items()}
        frac = {f: statistics.median(r["fraction_of_floor"] for r in rs) for f, rs in got.items()}
        each = {f: [round(r["step_ms"], 3) for r in rs] for f, rs in got.items()}
        print(f"  {quant} b{batch}: PDL 0 {ms['0']:.3f} ms ({frac['0']:.3f} of floor) "
              f"{each['0']} | PDL 1 {ms['1']:.3f} ms ({frac['1']:.3f}) {each['1']} | "
              f"0/1 {ms['0'] / ms['1']:.3f}x (> 1: PDL faster)")
PY
