#!/usr/bin/env bash
# Convert the GPU run's HF folders to the GGUFs that get committed.
#   test/demo/convert.sh OUT [DEST]     (DEST defaults to models/demo; needs bin/dflash-model)
set -eu
cd "$(dirname "$0")/../.."
OUT=$1; DEST=${2:-models/demo}
mkdir -p "$DEST"
bin/dflash-model convert "$OUT/target" "$DEST/demo-target-q8_0.gguf" --type q8_0 --tokenizer test/demo/tokenizer --name demo-target
bin/dflash-model convert "$OUT/draft" "$DEST/demo-draft-q8_0.gguf" --type q8_0 --name demo-draft --target "$DEST/demo-target-q8_0.gguf"
bin/dflash-model inspect "$DEST/demo-target-q8_0.gguf" | head -12
bin/dflash-model inspect "$DEST/demo-draft-q8_0.gguf" | head -24
ls -la "$DEST"
