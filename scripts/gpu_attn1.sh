#!/usr/bin/env bash
# Issues 60/61 (helper attn1): decode attention in one launch, on ONE H200, in priority order
# (BUDGET_S, 200 by default, skipping what would pass it): the GPU attention tests (one-launch
# decode against the reference and the two-launch path, graphs captured for 32k replayed short,
# FP8 pools, tickets reset across replays, PDL bits); the kernel sweep on 8B heads (b1/b8/b64/
# b256 x 1k/8k/32k, graph captured for 8k or the context, one- vs two-launch, PDL on); 8B
# decode b1/b64 at 1024 with CUDA graphs, PARASHIFT_ATTN_FUSED_REDUCE=1 vs 0; the one-launch
# kernel's configs at b64/b256; its tokens per split at b1; Qwen3-30B-A3B heads at b1; engine
# tokens (graphs vs eager, Triton vs torch); the decode with FP8 KV.
set -u
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
budget=${BUDGET_S:-200}
mkdir -p "$OUT"
source scripts/budget_step.sh
sweep=benchmarks/decode_attention_sweep.py
llama=benchmarks/shapes/llama-3.1-8b.json
qwen=benchmarks/shapes/qwen3-30b-a3b.json
budget_step gpu_tests 45 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider \
  tests/attention/test_triton_backend.py tests/kernels/test_pdl.py \
  -k "(test_triton_backend and (decode or graph or padding or warm_up or forced)) or rotary_and_attention"
budget_step sweep_8b 30 python3 $sweep --model $llama --batches 1 8 64 256 \
  --contexts 1000 1024 8192 32768 --pdl 1 --output "$OUT/sweep_8b.json"
for fused in 1 0; do
  budget_step decode_bf16_fused$fused 30 env PARASHIFT_ATTN_FUSED_REDUCE=$fused python3 \
    benchmarks/decode_throughput.py --model $llama --batch-sizes 1 64 --context 1024 \
    --decode-steps 32 --cuda-graphs --output "$OUT/decode_bf16_fused$fused.json"
done
budget_step configs_8b 25 python3 $sweep --model $llama --configs \
  --config-cells 64x1024 256x1024 --output "$OUT/configs_8b.json"
budget_step split_tokens 15 python3 $sweep --model $llama --split-tokens --contexts 1000 8000 \
  --output "$OUT/split_tokens.json"
budget_step sweep_qwen 12 python3 $sweep --model $qwen --batches 1 --contexts 1024 8192 --pdl 1 \
  --output "$OUT/sweep_qwen.json"
budget_step engine_tokens 30 env PARASHIFT_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/engine/test_gpu_engine.py -k "graphs_and_async and None or triton_matches_torch"
for fused in 1 0; do
  budget_step decode_fp8kv_fused$fused 25 env PARASHIFT_ATTN_FUSED_REDUCE=$fused python3 \
    benchmarks/decode_throughput.py --model $llama --batch-sizes 1 64 --context 1024 \
    --decode-steps 32 --cuda-graphs --kv-cache-dtype fp8 --output "$OUT/decode_fp8kv_fused$fused.json"
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
for line in open(f"{out}/steps") if os.path.exists(f"{out}/steps") else []:
    print("step", line.strip())
for path in sorted(glob.glob(f"{out}/decode_*.json")):
    doc = json.load(open(path))
    print(os.path.basename(path), " | ".join(
        f"b{r['batch']} {r['step_ms']:.3f} ms ({r['fraction_of_floor']:.3f})" for r in doc["rows"]))
for name in ("sweep_8b", "sweep_qwen"):
    if not os.path.exists(f"{out}/{name}.json"):
        continue
    cells = {}
    for r in json.load(open(f"{out}/{name}.json"))["rows"]:
        cells.setdefault((r["batch"], r["context"]), {})[(r["pdl"], r["fused"])] = r
    for (b, c), v in sorted(cells.items()):
        print(name, f"b{b} ctx{c}: " + "  ".join(
            f"pdl{p} {'one' if f else 'two'} {r['us_per_layer']:.2f}us ({r['of_copy_bw']:.2f})"
            for (p, f), r in sorted(v.items())))
PY
