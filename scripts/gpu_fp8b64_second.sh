#!/usr/bin/env bash
# (Helper fp8b64's call script as it ran; PARASHIFT_FP8_EARLY_TICKET was removed in session 51:
# its variants below now run without it.)
# Issue 60 (helper fp8b64: 8B FP8 decode at 64 rows), second call on ONE H200, in priority
# order (BUDGET_S, 235 by default, skips the last first). The first call (gpu_fp8b64_mid.sh
# at ce92660, superseded by this one) ran out of time in the engine's start-up (87 s, 77 of
# them timing ~700 GEMM candidates): here fp8_gemm.py's tl.dot configs, never chosen above 4
# rows since the TMA kernel, are left out of the benchmarks' choice (--no-dot-configs). Three launch-time switches of the FP8 GEMMs
# are A/B'd: PARASHIFT_FP8_TMA_PREFETCH_KB (the TMA GEMM's programs pull the start of their
# weight slice into L2 before the PDL wait), PARASHIFT_FP8_EARLY_SCALES (the tile's scales and
# bias loaded before the main loop) and PARASHIFT_FP8_EARLY_TICKET (a K split's ticket taken
# before its part is stored); ALL: the three at once.
# 1. GPU tests: the switches give the same bits (TMA and tl.dot kernels, split and not), row
#    tiles of 32 tokens and the registered configs against the dequantized product;
# 2. the candidates compiled in 15 processes, the TMA ones under each switch;
# 3. benchmarks/fp8_chain_variants.py, batch 64: the 8B's 32 FP8 layers as the engine runs them
#    (fused input quantization, PDL, CUDA graphs), one graph per setting, replayed in turn;
# 4. decode_throughput FP8 b64 (context 1024, CUDA graphs) in one engine: default against ALL
#    (graph variants, 2 rounds in turn), PDL off profiled (each kernel's own time);
# 5. fp8_gemm_sweep.py at 64 rows: the registered and the "b64" tiles (128- and 256-row tiles
#    split, row tiles of 32 tokens), x quantized before, timed in the decode chain, plain and ALL.
# Usage (repository root): OUT=dir [BUDGET_S=235] bash scripts/gpu_fp8b64_second.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-235}
mkdir -p "$OUT"
source scripts/budget_step.sh
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
PF=PARASHIFT_FP8_TMA_PREFETCH_KB
ES=PARASHIFT_FP8_EARLY_SCALES=1
ET=PARASHIFT_FP8_EARLY_TICKET=1
ALL=$PF=64,$ES,$ET
budget_step gpu_tests 20 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemm_tma.py -k "switches or fewer_tokens or registered"
budget_step warm 25 python3 benchmarks/fp8_gemm_sweep.py --warm-only --no-dot-configs --workers 15 \
  --settings $PF=64 $PF=128 $ES $ET $ALL
budget_step chain 35 python3 benchmarks/fp8_chain_variants.py --no-dot-configs --batch-sizes 64 \
  --repeats 15 --variants default $PF=64 $PF=128 $ES $ET $ALL PARASHIFT_PDL=late \
  --output "$OUT/chain.json"
budget_step decode 80 python3 benchmarks/decode_throughput.py --model $EIGHT_B --quantization fp8 \
  --no-dot-configs --batch-sizes 64 --context 1024 --decode-steps 32 --cuda-graphs --rounds 2 \
  --graph-variants $ALL PARASHIFT_PDL=0 --profile --profile-variants PARASHIFT_PDL=0 \
  --output "$OUT/decode.json"
budget_step sweep 40 python3 benchmarks/fp8_gemm_sweep.py --rows 64 --kernels b64 --x-fp8 --chain \
  --settings default $ALL --workers 15 --output "$OUT/sweep.json"
cat "$OUT/steps"
grep -h '^{' "$OUT"/chain.log | cut -c1-2000
grep -h '"variants"' -A30 "$OUT"/decode.log | head -40
