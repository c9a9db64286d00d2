#!/usr/bin/env bash
# Serve a model and drive one workload against it with `parashift bench serve`.
# Usage: benchmarks/serve_workload.sh OUT_DIR WORKLOAD "BENCH ARGS" MODEL [ENGINE FLAGS...]
# e.g.   benchmarks/serve_workload.sh out/chat chat "--num-requests 60 --request-rate 2,4,8" \
#            benchmarks/shapes/llama-3.1-8b.json --max-model-len 4096
#        benchmarks/serve_workload.sh out/bursty-tp2 bursty "--time-scale 0.2" \
#            benchmarks/shapes/llama-3.1-8b.json -tp 2 --max-model-len 8192
set -uo pipefail
out=${1:?output dir}; workload=${2:?workload}; bench_args=${3:-}; model=${4:?model}
shift 4
port=8123
mkdir -p "$out"
python3 -m parashift.cli serve "$model" --skip-tokenizer-init --dtype bfloat16 \
  --port $port "$@" > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
  sleep 1
done
# shellcheck disable=SC2086
python3 -m parashift.cli bench serve --base-url http://127.0.0.1:$port \
  --workload "$workload" --vocab-size 128256 --output-dir "$out" $bench_args
status=$?
kill -TERM $server; wait $server
# the layout changes, on stdout: a run's folder may not come back, its log does
grep -F 'of group(s)' "$out/server.log" | sed 's/^INFO [0-9-]* //' | tail -n 40
exit $status
