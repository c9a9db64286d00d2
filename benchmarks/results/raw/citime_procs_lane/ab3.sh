#!/bin/bash
# before3 then after3: the process lane's changed files, durations + the run's CPU (user+sys, reaped descendants)
run() {  # name tree files...
  local name=$1 tree=$2; shift 2
  cd "$tree" && rm -f /tmp/citime47/durations_$name.jsonl
  echo "$name start $(date +%H:%M:%S)" >> /tmp/citime47/ab3_times.txt
  PROCSPY_DURATIONS=/tmp/citime47/durations_$name.jsonl PROCSPY_OUT=/tmp/citime47/procspy_$name.json \
    PYTHONPATH=.:/tmp/citime47/plug /usr/bin/time -f "$name wall %e user %U sys %S" -a -o /tmp/citime47/ab3_times.txt \
    nice -n 5 /work/main/.venv/bin/python -m pytest -v -p no:cacheprovider -p procspy --durations=0 "$@" > /tmp/citime47/$name.log 2>&1
  echo "$name end $(date +%H:%M:%S) exit $?" >> /tmp/citime47/ab3_times.txt
}
COMMON="tests/distributed/test_multinode.py tests/bench/soak/test_soak.py tests/distributed/test_seesaw.py tests/distributed/test_executor.py tests/entrypoints/openai/test_lifecycle.py tests/distributed/test_ray_backend.py tests/entrypoints/openai/test_fault_isolation.py"
run before3 /tmp/citime47/before_tree $COMMON tests/bench/test_bench_live.py
run after3 /work/wt/citime $COMMON tests/bench/test_throughput_sidp.py
