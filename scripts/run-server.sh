#!/usr/bin/env bash
# Starts dflash_server on the tiny demo models: two blocks on the logical CPU
# devices cpu:0 and cpu:1 with load balancing, so fallback can be tried at
# once. Extra arguments are global options (placed before the first --model).
set -euo pipefail
bin=${1:-bin}
dir=${2:-bin/run}
shift 2 || true
exec "$bin/dflash_server" --load-balancing --load-balancing-primary-gpu cpu:0 \
  --host 127.0.0.1 --port "${PORT:-8080}" --routing-queue-limit 32 "$@" \
  --model "$dir/qwen3-tiny.gguf" --model-name qwen3-tiny --target-device cpu:0 \
    --max-ctx 2048 --max-concurrency 2 --kv-pool-tokens 4096 --default-max-tokens 64 \
  --model "$dir/qwen35-tiny.gguf" --model-name qwen35-tiny --target-device cpu:1 \
    --max-ctx 2048 --max-concurrency 2 --kv-pool-tokens 4096 --default-max-tokens 64
