#!/bin/bash
# usage: citime7_time.sh TREE LABEL FILE...  (one pytest per file, the same command in each tree)
tree=$1; label=$2; shift 2
out=/work/wt/citime7/benchmarks/results/raw/citime7_procs_engine_starts
cd "$tree"
for f in "$@"; do
  name=$(basename "$f" .py)_$label${RUN:+_$RUN}
  { echo "tree: $tree ($label)"; echo "load at start: $(cat /proc/loadavg)"; date -u;
    echo "command: /usr/bin/time -f '%e s wall' env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q $f -p no:cacheprovider --durations=0"
    /usr/bin/time -f '%e s wall' env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q "$f" -p no:cacheprovider --durations=0 2>&1
    echo "load at end: $(cat /proc/loadavg)"; date -u; } > "$out/$name.log" 2>&1
  tail -3 "$out/$name.log" | head -1; grep -E "passed|failed|wall" "$out/$name.log" | tail -2
done
