#!/usr/bin/env bash
# Issue 20's four-GPU runs, by part; each part has its own time limit and writes its log (and
# JSON where the benchmark writes one) to $OUT. From the repository root on nvidia-h200-x4 or
# nvidia-h100-x4, with the wheels of scripts/fetch_gpu_wheels.sh in .whl. A four-GPU machine is
# lent rarely, so the calls are meant to run back to back:
#   OUT=dir bash scripts/gpu_x4_runs.sh env plans8b p2p sidp_capacity   # call 1
#   OUT=dir bash scripts/gpu_x4_runs.sh tests flying seesaw             # call 2
#   OUT=dir bash scripts/gpu_x4_runs.sh plans70b flying_tp2 seesaw_pcie # call 3, if time is left
# Parts: env (topology, memory); plans8b and plans70b (static plans and Shift, `interactive`
# TTFT/TPOT and `batch` throughput, benchmarks/plans.py); p2p (SiDP probe at d=4: incast and
# rotated peer reads); sidp_capacity (Qwen3-32B KV capacity, SiDP against DP4 and DP2xTP2);
# tests (the distributed suite on NCCL, 4-rank cases included); flying (DP4 merging to wider
# TP groups and back, benchmarks/merge_split.py; flying_tp2 from two TP=2 groups); seesaw and seesaw_pcie (summarize, TP4 and
# PP4->TP4 and auto; NCCL_P2P_DISABLE=1 for the second).
set -u
: "${OUT:?a folder for the results}"
export PYTHONUNBUFFERED=1
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
SEVENTY_B=benchmarks/shapes/llama-3.1-70b.json
QWEN32=benchmarks/shapes/qwen3-32b.json

part() {  # part NAME SECONDS COMMAND: the command's output to $OUT/NAME.log, time-limited
  local name=$1 limit=$2 command=$3
  echo "== $name (limit ${limit}s) $(date +%T)"
  timeout -k 15 "$limit" bash -c "$command" > "$OUT/$name.log" 2>&1
  echo "== $name exit $? $(date +%T)"
  grep -E '^\{|passed|failed|error|Error' "$OUT/$name.log" | cut -c1-400 | tail -40
}

run_env() {
  nvidia-smi --query-gpu=name,memory.total --format=csv; nvidia-smi topo -m | head -6
  df -h /dev/shm; free -g | head -2
}

run_plans() {  # run_plans MODEL OUTPUT PLAN...
  local model=$1 output=$2; shift 2
  python3 benchmarks/plans.py --model "$model" --plans "$@" --interactive-requests 4 \
    --batch-requests 256 --input-len 2048 --output-len 128 --output "$output"
}

run_sidp_capacity() {
  python3 benchmarks/sidp_capacity.py --model $QWEN32 -dp 4 --gpu-memory-utilization 0.9 \
    --out "$OUT/sidp_capacity_dp4.json"
  python3 benchmarks/sidp_capacity.py --model $QWEN32 -dp 2 -tp 2 --gpu-memory-utilization 0.9 \
    --out "$OUT/sidp_capacity_dp2tp2.json"
}

run_seesaw() {  # run_seesaw PLAN... [--cuda-graphs]
  python3 benchmarks/seesaw.py --model $EIGHT_B --workloads summarize \
    --num-requests 128 --cpu-kv-gib 32 --plans "$@"
}

run_tests() {  # the distributed cases on four ranks, on NCCL with CUDA graphs
  local plans=tests/distributed/test_plans.py::test_plan_matches_single_device
  local shift=tests/distributed/test_shift.py::test_random_switch_schedules_match_single_device
  local seesaw=tests/distributed/test_seesaw.py::test_tokens_equal_one_device_over_many_transitions_and_one
  PARASHIFT_TEST_DEVICE=cuda PARASHIFT_TEST_CUDA_GRAPHS=1 python3 -m pytest -v -p no:cacheprovider \
    "$plans[gqa8x4-tp4]" "$plans[gqa8x4-sp4]" "$plans[gqa8x4-dp4]" "$plans[gqa8x4-pp4]" \
    "$plans[gqa8x4-sp2-tp2]" "$plans[gqa8x4-dp2-tp2]" "$plans[gqa8x4-pp2-tp2]" \
    "$plans[gqa8x4-lptp2,single,single]" "$plans[gqa8x4-lpsp2,tp2]" \
    "$plans[gqa8x4-lpsingle,pp2,single]" "$plans[gqa8x2-sp4]" "$plans[gqa8x2-tp4]" \
    "$shift[gqa8x2-sp4]" "$shift[gqa8x2-sp2-tp2]" "$shift[gqa8x4-sp2-tp2]" \
    "$seesaw[pp2xtp2-tp4]" "$seesaw[pp4-pp2xtp2]" \
    tests/distributed/test_plans.py::test_single_token_steps_and_preemption
}

export -f run_plans run_sidp_capacity run_seesaw run_tests
export EIGHT_B SEVENTY_B QWEN32 OUT
for name in "$@"; do
  case $name in
    env) run_env ;;
    plans8b) part plans8b 380 "run_plans $EIGHT_B $OUT/plans_8b.json \
           tp4 dp4 sp4 dp2tp2 sp2tp2 tp2pp2 shift-sp4 shift-sp2tp2 pp4" ;;
    plans70b) part plans70b 300 "run_plans $SEVENTY_B $OUT/plans_70b.json tp4 shift-sp4 sp2tp2" ;;
    p2p) part p2p 60 "python3 benchmarks/sidp_probe.py --parts p2p --out $OUT/sidp_p2p.json" ;;
    sidp_capacity) part sidp_capacity 120 run_sidp_capacity ;;
    tests) part tests 220 "run_tests" ;;
    flying) part flying 150 "python3 benchmarks/merge_split.py --model $EIGHT_B \
           --layout single,single,single,single --rounds 2" ;;
    flying_tp2) part flying_tp2 150 "python3 benchmarks/merge_split.py --model $EIGHT_B \
           --layout tp2,tp2 --rounds 2" ;;
    seesaw) part seesaw 230 "run_seesaw tp4 auto seesaw:pp4-tp4 --cuda-graphs" ;;
    seesaw_pcie) part seesaw_pcie 200 "NCCL_P2P_DISABLE=1 run_seesaw tp4 seesaw:pp4-tp4 --cuda-graphs" ;;
    *) echo "unknown part $name"; exit 2 ;;
  esac
done
