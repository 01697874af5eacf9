#!/usr/bin/env bash
# Starts dflash_server on the trained demo pair (models/demo: a small Qwen3 target trained on Go source and its
# DFlash draft): the target with its draft on cpu:0 (the primary) and the target alone on cpu:1, with load
# balancing, so a first request answers with readable Go and fallback can be tried at once. Extra arguments are
# global options (placed before the first --model).
set -euo pipefail
bin=${1:-bin}
dir=${2:-models/demo}
shift 2 || true
exec "$bin/dflash_server" --load-balancing --load-balancing-primary-gpu cpu:0 \
  --host 127.0.0.1 --port "${PORT:-8080}" --routing-queue-limit 32 "$@" \
  --model "$dir/demo-target-q8_0.gguf" --model-name demo --target-device cpu:0 \
    --draft "$dir/demo-draft-q8_0.gguf" --draft-device cpu:0 \
    --max-ctx 2048 --max-concurrency 2 --kv-pool-tokens 4096 --default-max-tokens 128 \
  --model "$dir/demo-target-q8_0.gguf" --model-name demo-plain --target-device cpu:1 \
    --max-ctx 2048 --max-concurrency 2 --kv-pool-tokens 4096 --default-max-tokens 128
