#!/usr/bin/env bash
# Issue 60 (helper gemv1), mid-session call on ONE H200 (BUDGET_S, 210 by default, cuts the
# last step first):
# 1. GPU tests: the GEMV by TMA (fp8_gemv_tma.py, every registered config in bf16) and the
#    plain GEMV's SiLU epilogue (fp8_gemv.py's epilogue moved into finish_rows);
# 2. benchmarks/read_ceiling.py: what a read-only kernel reaches at the 8B's FP8 projection
#    shapes and at 1 GiB (16-byte loads into registers, or TMA into shared memory);
# 3. benchmarks/fp8_gemm_sweep.py at one row, timed in the decode chain: every GEMV config
#    (fp8_gemv.py's registered ones, the TMA GEMV's registered and wider set) per projection,
#    and the TMA FP8 x FP8 GEMM given the row in E4M3 (--x-fp8: as the fused norms and
#    SiLU·mul hand it to qkv, gate_up and down; o would quantize it itself);
# 4. benchmarks/decode_chain.py, FP8, batch 1, 32 layers: the GEMM choice without the TMA
#    GEMV (PARASHIFT_FP8_TMA=0) against with it;
# 5. benchmarks/skinny_gemm.py: the bf16 LM head [128256, 4096] at one row, cuBLAS and the
#    skinny configs against the copy bandwidth.
# Usage (repository root): OUT=dir [BUDGET_S=240] bash scripts/gpu_gemv1_mid.sh
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-240}
mkdir -p "$OUT"
source scripts/budget_step.sh
budget_step gpu_tests 45 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_fp8_gemv_tma.py tests/kernels/test_fp8_gemv.py \
  -k "(test_fp8_gemv_tma and not engine) or silu_out_cuda"
budget_step read_ceiling 30 python3 benchmarks/read_ceiling.py --output "$OUT/read_ceiling.json"
budget_step sweep_b1 75 python3 benchmarks/fp8_gemm_sweep.py --rows 1 --chain --x-fp8 --kernels b1 \
  --workers 14 --output "$OUT/sweep_b1.json"
budget_step chain_fp8 60 python3 benchmarks/decode_chain.py --weights fp8 --no-dot-configs \
  --variants chain_no_tma chain --output "$OUT/chain_fp8.json"
budget_step lm_head 30 python3 benchmarks/skinny_gemm.py --rows 1 --projections lm_head --tma-gemv
cat "$OUT/steps"
grep -h '^{' "$OUT"/read_ceiling.log "$OUT"/sweep_b1.log "$OUT"/chain_fp8.log "$OUT"/lm_head.log | cut -c1-1500
