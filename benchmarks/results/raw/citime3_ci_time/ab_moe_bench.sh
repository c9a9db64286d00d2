#!/usr/bin/env bash
# A/B of tests/bench/test_moe_prefill_bench.py: the tree before (28cf06c) and this branch,
# interleaved (after, before, after), nice'd, the load before each.
set -u
PY=/work/main/.venv/bin/python
for tree in /work/wt/citime3 /tmp/c3/before /work/wt/citime3; do
  echo "== $tree load: $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd $tree && PYTHONPATH=. nice $PY -m pytest -q tests/bench/test_moe_prefill_bench.py -p no:cacheprovider --durations=0 2>&1 | grep -E "s call|passed|failed")
done
