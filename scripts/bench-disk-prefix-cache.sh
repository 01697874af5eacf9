#!/usr/bin/env bash
# Time to first token of a conversation's second turn whose first turn had a ~4k-token prompt, each turn on a
# freshly started server (a restart in between), with and without --disk-prefix-cache; the demo model on $DEVICE.
#   scripts/bench-disk-prefix-cache.sh [PORT]     (after make build; writes under a temporary directory)
# Environment: DEVICE (default cpu:0), BIN (the folder of dflash_server and plugins/, default bin), DFLASH_LIB_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-18300}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
device=${DEVICE:-cpu:0}
bin=${BIN:-bin}
# ~11 kB of Go source as the system prompt (a file of this repository, so a machine without Go can run it): about
# 4,000 tokens with the chat template
sys=$(python3 -c "import json,sys;print(json.dumps(open(sys.argv[1]).read()[:11000]))" sdk/engine/engine.go)
ask() {
  curl -s "localhost:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"auto\",\"max_tokens\":8,\"temperature\":0,\"messages\":$1}" |
    python3 -c "import json,sys; r=json.load(sys.stdin); print('  prompt', r['usage']['prompt_tokens'], 'cached', r['usage'].get('prompt_tokens_details',{}).get('cached_tokens'), 'ttft_ms', r['dflash']['prefill_ms'])"
}
turn1="[{\"role\":\"system\",\"content\":$sys},{\"role\":\"user\",\"content\":\"Summarize this file.\"}]"
turn2="[{\"role\":\"system\",\"content\":$sys},{\"role\":\"user\",\"content\":\"Summarize this file.\"},{\"role\":\"assistant\",\"content\":\"It implements string functions.\"},{\"role\":\"user\",\"content\":\"Which ones?\"}]"
serve() {
  "$bin/dflash_server" --plugin-dir "$bin/plugins" --port "$port" --model models/demo/demo-target-q8_0.gguf \
    --model-name demo --target-device "$device" --max-ctx 8192 "$@" >"$tmp/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 150); do curl -sf "localhost:$port/ready" >/dev/null && return; sleep 0.2; done
}
for mode in off on; do
  args=(--disk-prefix-cache off)
  [ $mode = on ] && args=(--disk-prefix-cache on --disk-prefix-cache-dir "$tmp/cache")
  serve "${args[@]}"; echo "cache $mode, turn 1:"; ask "$turn1"; kill -TERM $pid; wait $pid || true
  serve "${args[@]}"; echo "cache $mode, turn 2 after a restart (twice):"; ask "$turn2"; ask "$turn2"; kill -TERM $pid; wait $pid || true
done
echo "entries:"; ls -l "$tmp"/cache/*/
