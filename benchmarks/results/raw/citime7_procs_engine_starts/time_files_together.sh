#!/bin/bash
# usage: citime7_pair.sh TREE LABEL NAME FILE... (one pytest over the files, the same command in each tree)
tree=$1; label=$2; name=$3; shift 3
out=/work/wt/citime7/benchmarks/results/raw/citime7_procs_engine_starts
cd "$tree"
{ echo "tree: $tree ($label)"; echo "load at start: $(cat /proc/loadavg)"; date -u;
  echo "command: /usr/bin/time -f '%e s wall' env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q $* -p no:cacheprovider --durations=0"
  /usr/bin/time -f '%e s wall' env PYTHONPATH=. /work/main/.venv/bin/python -m pytest -q "$@" -p no:cacheprovider --durations=0 2>&1
  echo "load at end: $(cat /proc/loadavg)"; date -u; } > "$out/${name}_$label.log" 2>&1
grep -E "passed|failed|wall" "$out/${name}_$label.log" | tail -2
