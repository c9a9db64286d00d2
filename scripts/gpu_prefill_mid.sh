#!/usr/bin/env bash
# Issue 61 deliverable 1 (helper prefill), mid-session call on ONE H200, in priority order
# (BUDGET_S, 235 by default, skips the last first):
# 1. the 8B's one-prompt prefill at 4,096 / 16,384 / 32,768 tokens with a kernel breakdown
#    of each (prefill_throughput.py --profile), at this tree (HEAD's main path);
# 2. prefill_phases.py at 4,096 (host parts, device timeline, a torch.profiler trace);
# 3. the chunk-after-prefix route: the merge kernel and GQA in cuDNN's causal call, apart and
#    together, against session 43's route (prefill_attention.py; outputs against Triton's),
#    also at chunks and contexts under the route's thresholds (2,048 / 8,192) against Triton;
# 4. cuDNN's causal attention by input layout, the packed non-causal call, a prompt split
#    into 2 / 4 chunks run as the chunk route runs them; attention / the gate_up GEMM called
#    back to back for 3 s (does the GPU slow under a long prompt's load?);
# 5. prefill_phases.py at 32,768 (each layer's device time over the step, a trace);
# 6. GPU tests of the merge kernel and the cuDNN routes.
# The traces read on the CPU after: benchmarks/trace_breakdown.py TRACE (kinds, drift).
# nvidia-smi samples clocks, power and the clock-event reasons every 100 ms throughout
# ($OUT/smi.csv; $OUT/marks: each step's start in the same clock).
# Usage (repository root): OUT=dir [BUDGET_S=235] bash scripts/gpu_prefill_mid.sh
set -u
source scripts/gpu_prefill_common.sh
step profile 60 python3 benchmarks/prefill_throughput.py --model $EIGHT_B \
  --prompt-lens 4096 16384 32768 --repeats 3 --profile --output "$OUT/profile.json"
step phases_4k 35 python3 benchmarks/prefill_phases.py --model $EIGHT_B --prompt-len 4096 \
  --repeats 3 --trace-dir "$OUT/trace_4k" --output "$OUT/phases_4k.json"
step chunk_micro 35 python3 benchmarks/prefill_attention.py \
  --cases 8192:8192,8192:24576,2048:30720,16384:16384,2048:2048,2048:6144,4096:4096,1024:8192,512:16384 \
  --backends triton_paged,cudnn_backend,cudnn_chunk_forced,cudnn_chunk_merge0_gqa0,cudnn_chunk_merge1_gqa0,cudnn_chunk_merge0_gqa1 \
  --output "$OUT/chunk_micro.json"
step layouts 35 python3 benchmarks/cudnn_layouts.py --sustained-s 3 --output "$OUT/layouts.json"
step phases_32k 40 python3 benchmarks/prefill_phases.py --model $EIGHT_B --prompt-len 32768 \
  --repeats 2 --trace-dir "$OUT/trace_32k" --output "$OUT/phases_32k.json"
step gpu_tests 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_lse_merge.py tests/attention/test_cudnn_prefill.py
kill "$clock_sampler" 2> /dev/null
cat "$OUT/steps"
grep -h '^{' "$OUT"/chunk_micro.log "$OUT"/layouts.log 2>/dev/null | cut -c1-400
