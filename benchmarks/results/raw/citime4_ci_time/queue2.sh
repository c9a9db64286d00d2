run() { local dir=$1 label=$2; shift 2
  cd $dir && /usr/bin/time -f "user %U sys %S real %e" env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q -x "$@" -p no:cacheprovider --durations=12 -n 1 > /tmp/c4/$label.log 2>&1
  echo "$label done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/c4/queue.log; }
while pgrep -f "queue.sh" >/dev/null; do sleep 5; done
run /tmp/c4/before op_before tests/engine/test_output_processor.py
run /tmp/c4/before hf_before tests/models/test_smollm2.py tests/engine/test_prompt_logprobs.py
