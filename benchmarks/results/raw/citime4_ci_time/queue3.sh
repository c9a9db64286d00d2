run() { local dir=$1 label=$2; shift 2
  local l0=$(cut -d' ' -f1 /proc/loadavg)
  cd $dir && /usr/bin/time -f "user %U sys %S real %e" env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q -x "$@" -p no:cacheprovider --durations=5 -n 1 > /tmp/c4/$label.log 2>&1
  echo "$label done $(date +%T) load at start $l0, at end $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/c4/queue.log; }
run /work/wt/citime4 ab2_attn_after tests/deterministic/test_kernels.py -k "attention_interpreted"
run /tmp/c4/before ab2_attn_before tests/deterministic/test_kernels.py -k "attention_interpreted"
run /work/wt/citime4 ab2_moe_after tests/kernels/test_moe_small.py -k interpreted
run /tmp/c4/before ab2_moe_before tests/kernels/test_moe_small.py -k interpreted
