#!/usr/bin/env bash
# Serve a model and drive the `chat` workload at several request rates (issue 5's GPU run).
# Usage: benchmarks/serve_chat.sh OUT_DIR [MODEL] [NUM_REQUESTS] [RATES]
set -uo pipefail
out=${1:?output dir}; model=${2:-benchmarks/shapes/llama-3.1-8b.json}
num=${3:-100}; rates=${4:-2,4,8}; port=8123
python3 -m parashift.entrypoints.cli serve "$model" --skip-tokenizer-init --dtype bfloat16 \
  --max-model-len 4096 --port $port > "$out/server.log" 2>&1 &
server=$!
for _ in $(seq 240); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" 2>/dev/null && break
  sleep 1
done
python3 -m parashift.entrypoints.cli bench serve --base-url http://127.0.0.1:$port --workload chat \
  --num-requests "$num" --request-rate "$rates" --vocab-size 128256 --slo ttft:500,tpot:50 \
  --output-dir "$out/chat"
status=$?
kill -TERM $server; wait $server
exit $status
