set -x
W=/work/wt/citime2
cd /tmp/citime2/base && PYTHONPATH=. nice -n 10 /work/main/.venv/bin/python $W/benchmarks/process_tree_cpu.py /work/main/.venv/bin/python -m pytest -q -x tests/distributed/test_multinode.py -p no:cacheprovider --durations=0 > /tmp/citime2/mn_before.log 2>&1
cd $W && PYTHONPATH=. nice -n 10 /work/main/.venv/bin/python $W/benchmarks/process_tree_cpu.py /work/main/.venv/bin/python -m pytest -q -x tests/distributed/test_multinode.py -p no:cacheprovider --durations=0 > /tmp/citime2/mn_after.log 2>&1
