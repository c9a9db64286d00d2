#!/usr/bin/env bash
# Issues 60/61 (session 49, helper rope64): RoPE (with the q/k norms) and the KV write inside
# the one-launch decode attention (attention/triton_decode_rope.py, PARASHIFT_ATTN_ROPE_ONE_LAUNCH,
# default 0), on ONE H200, in priority order (BUDGET_S, 150 by default on a warm machine; the
# last steps are skipped first):
# 1. GPU tests (~55 s): the fold's output and pool bit for bit those of the rotary kernel then
#    the one-launch kernel (8B heads, bf16, 64 rows unsplit and 8 / 3 rows split, with and
#    without q/k norms; the small interpreted cases in bf16/fp16/fp32), an engine's greedy
#    tokens with it on and off (tiny Llama and Qwen3, CUDA graphs), the rotary kernel (its
#    arithmetic moved to kernels/rotary_values.py) against torch exactly, PDL's same bits;
# 2. decode_throughput 8B FP8 b64 (context 1024, CUDA graphs): default against
#    PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1, graph variants in one engine, 3 rounds in turn (~60 s
#    with its FP8 GEMM compiles where Triton's cache is cold);
# 3. the same in bf16 (~35 s);
# 4. the decode chain alone (benchmarks/fp8_chain_variants.py, 8B FP8 layers at 64 rows, PDL,
#    graphs): µs a layer with the fold against without, and `same_bits` of the two (~20 s;
#    BUDGET_S=180 to be sure it runs).
# Usage (repository root): OUT=dir [BUDGET_S=150] bash scripts/gpu_rope64.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-150}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
ENGINE="--model $EIGHT_B --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs \
  --rounds 3 --graph-variants PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1"
budget_step gpu_tests 55 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/attention/test_rotate_attend.py tests/kernels/test_rotary.py tests/kernels/test_pdl.py \
  -k "(test_rotate_attend and not interpreted) or (test_rotary and cuda) or rotary_and_attention"
budget_step engine_fp8 60 python3 benchmarks/decode_throughput.py $ENGINE --quantization fp8 \
  --no-dot-configs --output "$OUT/engine_fp8.json"
budget_step engine_bf16 35 python3 benchmarks/decode_throughput.py $ENGINE \
  --output "$OUT/engine_bf16.json"
budget_step chain_fp8 20 python3 benchmarks/fp8_chain_variants.py --batch-sizes 64 \
  --layers 32 --repeats 21 --no-dot-configs \
  --variants default PARASHIFT_ATTN_ROPE_ONE_LAUNCH=1 --output "$OUT/chain_fp8.json"
cat "$OUT/steps"
for f in "$OUT"/engine_*.json; do
  [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(sys.argv[1], d.get('variants') or [(r['batch'], round(r['step_ms'], 4), \
round(r['fraction_of_floor'], 3)) for r in d['rows']])" "$f"
done
[ -f "$OUT/chain_fp8.json" ] && cut -c1-1500 "$OUT/chain_fp8.json"
exit 0
