run() { # dir label args...
  local dir=$1 label=$2; shift 2
  cd $dir && /usr/bin/time -f "user %U sys %S real %e" env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q -x "$@" -p no:cacheprovider --durations=12 -n 1 > /tmp/c4/$label.log 2>&1
  echo "$label done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/c4/queue.log
}
while pgrep -f "test_moe_small.py -p no:cacheprovider" >/dev/null; do sleep 5; done
run /work/wt/citime4 attn_after tests/deterministic/test_kernels.py -k "attention_interpreted"
run /tmp/c4/before attn_before_pytest tests/deterministic/test_kernels.py -k "attention_interpreted"
run /tmp/c4/before moe_before tests/kernels/test_moe_small.py
run /tmp/c4/before quality_before tests/quantization/test_quality.py
