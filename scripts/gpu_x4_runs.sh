#!/usr/bin/env bash
# Issue 20's four-GPU runs, by part; each part has its own time limit and writes its log (and
# JSON where the benchmark writes one) to $OUT. From the repository root on nvidia-h200-x4 or
# nvidia-h100-x4, with the wheels of scripts/fetch_gpu_wheels.sh in .whl. A four-GPU machine is
# lent rarely, so the calls are meant to run back to back. Run so far: thirteenth session env
# plans8b p2p sidp_capacity tests flying seesaw plans70b seesaw_pcie; fourteenth prefill_profile
# flying bursty plans70b flying_priority seesaw_more flying70b sidp_capacity sidp_tail
# seesaw_chat max_context tests_rest; fifteenth flying_priority bursty_flying seesaw_more
# plans70b_pp sidp_tail seesaw_chat tests_rest sidp_tail70b flying_tp2 (some cut by their
# limits, the last three on H100s); sixteenth bursty_flying flying_priority seesaw_more
# plans70b_pp sidp_tail70b sidp_modes tests_rest and 4-rank SiDP/Flying/Seesaw tests
# (docs/benchmark_log.md). The seventeenth session ran, on two H200s, the stages' graphs of PP2
# and SiDP's CaS graphs, which are now the default; the eighteenth tests_rest pp_graphs70b
# sidp_graphs bursty_flying priority_dp4 and the SiDP tests at 2x2 (a start-up hang, fixed).
# The nineteenth ran bursty (Shift cut), sidp_graphs, flying_priority, sidp_tail70b; the
# twentieth flying_priority prefill_profile bursty70b, then mixed_graphs and tests_mixed (steps
# that prefill as CUDA graphs, built that session).
# The next session's calls (seconds expected on 4 H200s; each call's limits add up to under
# 600; end each with `trim`, else the results' file count runs over and logs are left behind;
# a call returns 8 files, so the transitions are printed into the part's log):
#   OUT=dir bash scripts/gpu_x4_runs.sh bursty trim  # ~380 (TP4, Shift and Flying TTFT with
#     mixed-step graphs: did their gap to DP4 close?)
#   OUT=dir bash scripts/gpu_x4_runs.sh flying_priority trim  # ~280 (the same for `priority`)
#   OUT=dir bash scripts/gpu_x4_runs.sh bursty70b trim  # ~350 (at a quarter of the rates: the
#     8B's overloaded every 70B server)
#   OUT=dir bash scripts/gpu_x4_runs.sh faults trim  # ~450 (issue 65 part 5: a worker SIGKILLed
#     under `chat`, 400 requests: -dp 4 and -dp 2 -tp 2, rank 1 then rank 0, a fresh engine each)
#   OUT=dir bash scripts/gpu_x4_runs.sh bursty_seqs trim  # ~200 (TP4 and Shift with mixed
#     graphs of 256 sequences instead of 64: bursts run steps of more than 64, eagerly)
# Parts: env (topology, memory); mixed_graphs (one prompt's prefill per plan, steps that
# prefill in CUDA graphs against eager); tests_mixed (the NCCL tests of single-stage plans,
# Shift and Flying, and the one-GPU graph tests); prefill_profile (one prompt's prefill under one GPU, TP4,
# SP4 and Shift SP4<->TP4 with every rank's kernel times: the thirteenth session's SP4 and
# Shift TTFTs were 0.21 and 0.17 of their floors); plans8b and plans70b (static plans and Shift, `interactive`
# TTFT/TPOT and `batch` throughput, benchmarks/plans.py; 70B: 2 and 32 requests, no SP4, which
# does not fit; plans70b_pp its pipelined plans, pp_graphs70b the same with --cuda-graphs);
# p2p (SiDP probe at d=4: incast and rotated peer reads); sidp_capacity (Qwen3-32B KV capacity,
# SiDP against DP4 and DP2xTP2); sidp_tail and sidp_tail70b (`tail`, in process, --share-ffn
# against plain DP for Qwen3-32B and the 70B shape, at the default and 0.6 memory utilization;
# sidp_modes: Qwen3-32B's --share-ffn under WaS and under the sidp policy; sidp_graphs: its
# CaS with graphs against eager and plain DP4);
# tests (the distributed suite on NCCL, 4-rank cases included; tests_rest those the first run
# did not reach or failed, and SiDP and Flying at 4 ranks); flying (DP4 merging to wider TP
# groups and back, benchmarks/merge_split.py; flying_tp2 from two TP=2 groups, flying70b the
# 70B shape from two TP=2 groups); max_context (benchmarks/max_context.py: KV tokens and longest
# context per width of Flying's layouts, the 8B from DP4, the 70B from 2xTP2); bursty and flying_priority (`parashift bench serve` against a server:
# Flying -dp 4 against static DP4, TP4 and Shift SP4<->TP4, and the `priority` mix against DP4
# and TP4; priority_dp4 its DP4 row alone; bursty70b: the 70B, Flying from 2xTP2 against
# static 2xTP2 and TP4); seesaw and seesaw_pcie (summarize, TP4 and PP4->TP4 and auto;
# NCCL_P2P_DISABLE=1
# for the second; auto:4 is auto on four GPUs, and runs on the CPU too); seesaw_more (the static rows and the other pairs on summarize) and
# seesaw_chat (`chat`).
# SMOKE=1 runs the parts on the CPU with a 4-layer tiny shape at tiny scale: a check of every
# command's flags and plan names, not a measurement (p2p and sidp_capacity need GPUs; the tests
# are only collected).
set -u
: "${OUT:?a folder for the results}"
export PYTHONUNBUFFERED=1
EIGHT_B=benchmarks/shapes/llama-3.1-8b.json
SEVENTY_B=benchmarks/shapes/llama-3.1-70b.json
QWEN32=benchmarks/shapes/qwen3-32b.json
VOCAB=128256  # the token ids `bench serve` sends
# appended to each tool's flags (the last value of a flag wins): empty but under SMOKE
PLANS_ARGS="" SEESAW_ARGS="" SERVE_ARGS="" TAIL_ARGS="" MERGE_ARGS="" CONTEXT_ARGS="" PREFILL_ARGS=""
FAULTS_ARGS=""
if [ "${SMOKE:-0}" = 1 ]; then
  python3 -c "import json; c = json.load(open('benchmarks/shapes/tiny-llama.json'))
c.update(num_hidden_layers=4, num_key_value_heads=4, max_position_embeddings=16384)
json.dump(c, open('$OUT/tiny4.json', 'w'))"
  EIGHT_B=$OUT/tiny4.json SEVENTY_B=$OUT/tiny4.json QWEN32=$OUT/tiny4.json VOCAB=512
  PLANS_ARGS="--interactive-requests 1 --batch-requests 4 --input-len 32 --output-len 8"
  SEESAW_ARGS="--num-requests 4 --length-scale 0.01 --cpu-kv-gib 0.01 --max-model-len 128
               --no-cuda-graphs"
  SERVE_ARGS="--num-requests 6 --length-scale 0.01"
  TAIL_ARGS="--num-requests 8 --length-scale 0.01"
  MERGE_ARGS="--input-len 32 --light-output-len 16 --batch-requests 8 --rounds 1"
  CONTEXT_ARGS="--max-model-len 16384"
  PREFILL_ARGS="--prompt-lens 64 128 --repeats 1"
  FAULTS_ARGS="--dtype float32 --num-requests 16 --length-scale 0.1 --max-model-len 512"
fi

part() {  # part NAME SECONDS COMMAND: the command's output to $OUT/NAME.log, time-limited
  local name=$1 limit=$2 command=$3
  echo "== $name (limit ${limit}s) $(date +%T)"
  timeout -k 15 "$limit" bash -c "$command" > "$OUT/$name.log" 2>&1
  echo "== $name exit $? $(date +%T)"
  grep -E '^\{|passed|failed|error|Error|^prio|^TTFT|^TPOT|^====|throughput' "$OUT/$name.log" \
    | cut -c1-400 | tail -40
}

run_env() {
  nvidia-smi --query-gpu=name,memory.total --format=csv; nvidia-smi topo -m | head -6
  df -h /dev/shm; free -g | head -2
}

run_plans() {  # run_plans MODEL OUTPUT PLAN...; BATCH and INTERACTIVE: requests of each
  local model=$1 output=$2; shift 2
  python3 benchmarks/plans.py --model "$model" --plans "$@" \
    --interactive-requests "${INTERACTIVE:-4}" --batch-requests "${BATCH:-256}" \
    --input-len 2048 --output-len 128 --output "$output" $PLANS_ARGS
}

run_prefill_profile() {  # one prompt's prefill step per plan, each rank's kernels
  for plan in single tp4 sp4 shift-sp4; do
    python3 benchmarks/prefill_throughput.py --model $EIGHT_B --plan $plan --prompt-lens 2048 8192 \
      --repeats 3 --profile --output "$OUT/prefill_$plan.json" $PREFILL_ARGS
  done
}

run_mixed_graphs() {  # one prompt's prefill per plan, steps that prefill in graphs and eager
  for plan in single tp4 sp4 shift-sp4; do
    for graphs in --mixed-step-graphs --no-mixed-step-graphs; do
      python3 benchmarks/prefill_throughput.py --model $EIGHT_B --plan $plan \
        --prompt-lens 256 1024 2048 --repeats 5 $graphs $PREFILL_ARGS 2>&1 | grep '^{'
    done
  done
}

run_sidp_capacity() {
  python3 benchmarks/sidp_capacity.py --model $QWEN32 -dp 4 --gpu-memory-utilization 0.9 \
    --out "$OUT/sidp_capacity_dp4.json"
  python3 benchmarks/sidp_capacity.py --model $QWEN32 -dp 2 -tp 2 --gpu-memory-utilization 0.9 \
    --out "$OUT/sidp_capacity_dp2tp2.json"
}

run_tail() {  # run_tail MODEL NAME ENGINE FLAGS...: the `tail` workload in process, scaled
  local model=$1 name=$2; shift 2  # 1000 requests, 51 in, out up to 559 (median 10)
  python3 -m parashift.bench throughput --workload tail --num-requests 1000 --length-scale 0.05 \
    --model "$model" --dtype bfloat16 --max-model-len 2048 --output-json "$OUT/tail_$name.json" \
    "$@" $TAIL_ARGS
}

run_sidp_tail() {  # run_sidp_tail MODEL NAME PLAIN-FLAGS SIDP-FLAGS: each at 0.9 and 0.6
  local model=$1 name=$2 plain=$3 shared=$4
  for util in 0.9 0.6; do
    run_tail "$model" "${name}_plain_$util" $plain --gpu-memory-utilization $util
    run_tail "$model" "${name}_sidp_$util" $shared --share-ffn --gpu-memory-utilization $util
  done
}

run_serve() {  # run_serve NAME WORKLOAD "BENCH ARGS" ENGINE FLAGS...: a server of the 8B shape
  local name=$1 workload=$2 bench=$3; shift 3  # (of $SERVE_MODEL where set)
  bash benchmarks/serve_workload.sh "$OUT/$name" "$workload" \
    "$bench --vocab-size $VOCAB $SERVE_ARGS" "${SERVE_MODEL:-$EIGHT_B}" --max-model-len 8192 "$@"
}

run_bursty() {  # bursty over 30 s, four 1.5 s bursts at 30 req/s (about 230 requests)
  run_serve bursty_flying bursty "--time-scale 0.05" -dp 4 --parallel-policy flying
  run_serve bursty_dp4 bursty "--time-scale 0.05" -dp 4
  run_serve bursty_tp4 bursty "--time-scale 0.05" -tp 4
  run_serve bursty_shift bursty "--time-scale 0.05" -sp 4 --parallel-policy shift
}

run_bursty70b() {  # the 70B: Flying from two TP2 groups against them and TP4 (the paper's
  # setting: a replica's prefill is slow, so TP pays at light load). At the 8B's rates every
  # server queued for seconds (twentieth session): a quarter of them, over 60 s, gives steady
  # stretches at 0.5 req/s and four 3-s bursts at 7.5 req/s (~115 requests)
  export SERVE_MODEL=$SEVENTY_B
  local scale="--time-scale 0.1 --rate-scale 0.25"
  run_serve bursty70b_flying bursty "$scale" -dp 2 -tp 2 --parallel-policy flying
  run_serve bursty70b_dp2tp2 bursty "$scale" -dp 2 -tp 2
  run_serve bursty70b_tp4 bursty "$scale" -tp 4
}

run_priority() {  # the priority mix: 80 requests at 4 req/s (the middle of its 3-5), 20% urgent
  run_serve priority_flying priority "--request-rate 4 --num-requests 80" \
    -dp 4 --parallel-policy flying
  run_serve priority_tp4 priority "--request-rate 4 --num-requests 80" -tp 4
  run_serve priority_dp4 priority "--request-rate 4 --num-requests 80" -dp 4
}

run_max_context() {  # per width: Flying's layouts from DP4 (8B) and from 2xTP2 (70B)
  python3 benchmarks/max_context.py --model $EIGHT_B -dp 4 $CONTEXT_ARGS
  python3 benchmarks/max_context.py --model $SEVENTY_B --layout tp2,tp2 $CONTEXT_ARGS
}

run_seesaw() {  # run_seesaw OUTPUT WORKLOAD REQUESTS PLAN... [--cuda-graphs]
  local output=$1 workload=$2 requests=$3; shift 3
  python3 benchmarks/seesaw.py --model $EIGHT_B --workloads "$workload" \
    --num-requests "$requests" --cpu-kv-gib 32 --output "$output" --plans "$@" $SEESAW_ARGS
}

run_tests() {  # run_tests all|rest: the distributed cases on four ranks, on NCCL with CUDA graphs
  local plans=tests/distributed/test_plans.py::test_plan_matches_single_device
  local shift=tests/distributed/test_shift.py::test_random_switch_schedules_match_single_device
  local seesaw=tests/distributed/test_seesaw.py::test_tokens_equal_one_device_over_many_transitions_and_one
  local sidp=tests/distributed/test_sidp.py
  local first=("$plans[gqa8x4-tp4]" "$plans[gqa8x4-sp4]" "$plans[gqa8x4-dp4]"
    "$plans[gqa8x4-sp2-tp2]" "$plans[gqa8x4-dp2-tp2]" "$plans[gqa8x4-lptp2,single,single]"
    "$plans[gqa8x4-lpsp2,tp2]")
  # not reached in the runs so far, or failed in the sixteenth session's (a test's own doing);
  # pipelined plans' stages and SiDP's CaS at four ranks, in graphs by default since the
  # seventeenth session
  local rest=("$shift[gqa8x4-sp2-tp2]" "$seesaw[pp4-pp2xtp2]"
    tests/distributed/test_flying_policy.py::test_random_arrivals_and_priorities_give_the_reference_tokens
    "$plans[gqa8x4-pp4]" "$plans[gqa8x4-pp2-tp2]" "$plans[gqa8x4-pp3]"
    "$plans[gqa8x4-lpsingle,pp2,single]" "$sidp::test_tokens_equal_the_reference[cas-4-1]"
    "$sidp::test_tokens_equal_the_reference[cas-2-2]")
  # steps that prefill replay graphs (mixed buckets) under every single-stage plan and switch
  local mixed=("$plans[gqa8x4-tp4]" "$plans[gqa8x4-sp4]" "$plans[gqa8x4-dp2-tp2]"
    "$shift[gqa8x4-sp2-tp2]"
    tests/distributed/test_flying_policy.py::test_random_arrivals_and_priorities_give_the_reference_tokens
    tests/engine/test_gpu_engine.py)
  local cases=("${first[@]}" "${rest[@]}")
  [ "$1" = rest ] && cases=("${rest[@]}")
  [ "$1" = mixed ] && cases=("${mixed[@]}")
  if [ "${SMOKE:-0}" = 1 ]; then  # on the CPU: the ids only
    python3 -m pytest -q --collect-only -p no:cacheprovider "${cases[@]}"; return
  fi
  PARASHIFT_TEST_DEVICE=cuda PARASHIFT_TEST_CUDA_GRAPHS=1 python3 -m pytest -v -p no:cacheprovider \
    "${cases[@]}"
}

run_faults() {  # -dp 4 and -dp 2 -tp 2: rank 1's worker, then rank 0's in a fresh engine
  for layout in "dp4:-dp 4" "dp2tp2:-dp 2 -tp 2"; do
    for rank in 1 0; do
      FAULTS_MODEL=$EIGHT_B bash scripts/gpu_faults.sh "${layout%%:*}_rank$rank" $rank 135 \
        ${layout#*:}
    done
  done
}

export -f run_faults run_plans run_sidp_capacity run_tail run_sidp_tail run_serve run_bursty run_bursty70b \
  run_priority \
  run_max_context run_seesaw run_tests run_prefill_profile run_mixed_graphs
export EIGHT_B SEVENTY_B QWEN32 OUT VOCAB PLANS_ARGS SEESAW_ARGS SERVE_ARGS TAIL_ARGS MERGE_ARGS \
  CONTEXT_ARGS PREFILL_ARGS FAULTS_ARGS SMOKE
for name in "$@"; do
  case $name in
    env) run_env ;;
    prefill_profile) part prefill_profile 170 run_prefill_profile ;;
    mixed_graphs) part mixed_graphs 360 run_mixed_graphs ;;
    tests_mixed) part tests_mixed 200 "run_tests mixed" ;;
    plans8b) part plans8b 380 "run_plans $EIGHT_B $OUT/plans_8b.json \
           tp4 dp4 sp4 dp2tp2 sp2tp2 tp2pp2 shift-sp4 shift-sp2tp2 pp4" ;;
    # SP4 (and so shift-sp4) holds all 141 GB of 70B weights on each GPU: left out
    plans70b) part plans70b 220 "INTERACTIVE=2 BATCH=32 run_plans $SEVENTY_B $OUT/plans_70b.json \
           tp4 sp2tp2 shift-sp2tp2 dp2tp2" ;;
    plans70b_pp) part plans70b_pp 200 "INTERACTIVE=2 BATCH=32 run_plans $SEVENTY_B \
           $OUT/plans_70b_pp.json tp2pp2 pp4" ;;
    p2p) part p2p 60 "python3 benchmarks/sidp_probe.py --parts p2p --out $OUT/sidp_p2p.json" ;;
    sidp_capacity) part sidp_capacity 80 run_sidp_capacity ;;
    sidp_tail) part sidp_tail 170 "run_sidp_tail $QWEN32 qwen32b '-dp 4' '-dp 4'" ;;
    pp_graphs70b) part pp_graphs70b 200 "INTERACTIVE=2 BATCH=32 run_plans $SEVENTY_B \
           $OUT/plans_70b_pp_graphs.json tp2pp2 pp4 --cuda-graphs" ;;
    sidp_graphs) part sidp_graphs 300 "run_tail $QWEN32 qwen32b_plain -dp 4; \
           run_tail $QWEN32 qwen32b_cas_graphs -dp 4 --share-ffn --cuda-graphs; \
           run_tail $QWEN32 qwen32b_cas_eager -dp 4 --share-ffn --no-cuda-graphs" ;;
    sidp_modes) part sidp_modes 170 "run_tail $QWEN32 qwen32b_was -dp 4 --share-ffn \
           --sidp-mode was; run_tail $QWEN32 qwen32b_policy -dp 4 --share-ffn \
           --parallel-policy sidp" ;;
    sidp_tail70b) part sidp_tail70b 230 "run_sidp_tail $SEVENTY_B 70b '-dp 2 -tp 2' '-dp 4'" ;;
    tests) part tests 220 "run_tests all" ;;
    tests_rest) part tests_rest 300 "run_tests rest" ;;
    flying) part flying 100 "python3 benchmarks/merge_split.py --model $EIGHT_B \
           --layout single,single,single,single --rounds 2 $MERGE_ARGS" ;;
    flying_tp2) part flying_tp2 100 "python3 benchmarks/merge_split.py --model $EIGHT_B \
           --layout tp2,tp2 --rounds 2 $MERGE_ARGS" ;;
    flying70b) part flying70b 120 "python3 benchmarks/merge_split.py --model $SEVENTY_B \
           --layout tp2,tp2 --rounds 2 $MERGE_ARGS" ;;
    max_context) part max_context 80 run_max_context ;;
    bursty) part bursty 400 run_bursty ;;
    bursty_seqs) part bursty_seqs 260 "PARASHIFT_MIXED_GRAPH_SEQS=256 run_serve bursty_tp4_256 \
      bursty '--time-scale 0.05' -tp 4; PARASHIFT_MIXED_GRAPH_SEQS=256 run_serve \
      bursty_shift_256 bursty '--time-scale 0.05' -sp 4 --parallel-policy shift" ;;
    flying_priority) part flying_priority 270 run_priority ;;
    bursty70b) part bursty70b 450 run_bursty70b ;;
    seesaw) part seesaw 230 "run_seesaw $OUT/seesaw.json summarize 128 \
           tp4 auto:4 seesaw:pp4-tp4 --cuda-graphs" ;;
    seesaw_pcie) part seesaw_pcie 200 "NCCL_P2P_DISABLE=1 run_seesaw $OUT/seesaw_pcie.json \
           summarize 128 tp4 seesaw:pp4-tp4 --cuda-graphs" ;;
    # the static rows `seesaw` left out, P4->T2P2 and DP2x(P2->T2)
    seesaw_more) part seesaw_more 200 "run_seesaw $OUT/seesaw_more.json summarize 128 \
           dp4 dp2tp2 pp4 tp2pp2 seesaw:pp4-pp2xtp2 dp2xseesaw:pp2-tp2" ;;
    seesaw_chat) part seesaw_chat 160 "run_seesaw $OUT/seesaw_chat.json chat 128 \
           tp4 auto:4 seesaw:pp4-tp4 --cuda-graphs" ;;
    bursty_flying) part bursty_flying 170 \
           "run_serve bursty_flying bursty '--time-scale 0.05' -dp 4 --parallel-policy flying" ;;
    priority_dp4) part priority_dp4 120 "run_serve priority_dp4 priority \
           '--request-rate 4 --num-requests 80' -dp 4" ;;
    # issue 65 part 5 (scripts/gpu_faults.sh): 400 `chat` requests, one worker SIGKILLed
    faults) part faults 570 run_faults ;;
    trim) find "$OUT" \( -name '*timeline.csv' -o -name '*-requests.json' \) -delete ;;
    *) echo "unknown part $name"; exit 2 ;;
  esac
done
