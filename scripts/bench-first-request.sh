#!/usr/bin/env bash
# Time to first token of the first three requests after a start (the same prompt: a step graph of a shape is captured
# the second time it runs), with the load's warm-up requests (--warmup on, auto's choice on a GPU) and without
# (--warmup off), and each start's time to /ready; one model on $DEVICE.
#   scripts/bench-first-request.sh [PORT]     (after make build)
# Environment: MODEL (a GGUF, default the demo target), DEVICE (default cpu:0), BIN (the folder of dflash_server and
# plugins/, default bin), DFLASH_LIB_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-18310}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
device=${DEVICE:-cpu:0}
bin=${BIN:-bin}
model=${MODEL:-models/demo/demo-target-q8_0.gguf}
ask() {  # a short question: a prompt of a few dozen tokens, eight tokens out
  curl -s "localhost:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"auto","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"Write a Go function that reverses a string."}]}' |
    python3 -c "import json,sys; r=json.load(sys.stdin); print('  prompt', r['usage']['prompt_tokens'], 'ttft_ms', r['dflash']['prefill_ms'])"
}
for warmup in off on; do
  t0=$(date +%s.%N)
  "$bin/dflash_server" --plugin-dir "$bin/plugins" --port "$port" --model "$model" --model-name m \
    --target-device "$device" --max-ctx 4096 --warmup "$warmup" >"$tmp/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -sf "localhost:$port/ready" >/dev/null && break; sleep 0.1; done
  echo "warmup $warmup: ready after $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$(date +%s.%N)") s; first three requests:"
  ask; ask; ask
  kill -TERM $pid; wait $pid || true
done
