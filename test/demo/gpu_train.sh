#!/usr/bin/env bash
# Train the demo target (qwen3) and its DFlash draft; see test/demo/README.md.
#
#   test/demo/gpu_train.sh [--smoke] [OUT]      (from the repo root; OUT defaults to $OUT)
#
# Reads the corpus from .gpu-demo/ (test/demo/prep_corpus.py writes it) and
# writes OUT/target/{config.json,model.safetensors},
# OUT/draft/{config.json,model.safetensors}, OUT/results.json and
# OUT/train.log. The target is written before the draft starts, so a failing
# draft still leaves it. Full mode: ~7.5 minutes on one H200, killed at 9.
# --smoke: tiny sizes on CPU in about a minute, then (if bin/dflash-model
# exists) converts both folders to q8_0 GGUFs in OUT and inspects them.
set -u
cd "$(dirname "$0")/../.."
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then SMOKE=1; shift; fi
OUT=${1:-${OUT:-}}
if [ -z "$OUT" ]; then echo "usage: $0 [--smoke] OUT (or set \$OUT)" >&2; exit 2; fi
DATA=${DEMO_DATA:-.gpu-demo}
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch' 2>/dev/null; then PY=/usr/bin/python3; fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/train.log"
: > "$LOG"
START=$(date +%s)
DEADLINE=$((START + 530))   # hard stop for everything (9 minutes less slack)
say() { echo "[gpu_train] $*" | tee -a "$LOG"; }

for f in train.u16.xz heldout.u16.xz; do
  [ -f "$DATA/$f" ] || { say "missing $DATA/$f: run test/demo/prep_corpus.py first"; exit 1; }
done
say "python $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"

if [ "$SMOKE" = 1 ]; then
  TARGET_ARGS=(--time-limit 15 --hidden 64 --layers 8 --heads 4 --kv-heads 2 --head-dim 16 --ffn 128
               --seq 64 --batch 4 --log-every 10 --sample-tokens 12 --eval-tokens 4096)
  DRAFT_ARGS=(--time-limit 12 --seq 64 --batch 4 --anchors 4 --log-every 10 --sample-tokens 12
              --al-lengths 16 40 --al-positions 8 --chain-prompts 2 --chain-new 16)
  TARGET_KILL=60
else
  TARGET_ARGS=(--time-limit 210)
  DRAFT_ARGS=(--time-limit 165)
  TARGET_KILL=280
fi

say "target: training"
timeout -k 5 "$TARGET_KILL" "$PY" test/demo/train.py target --data "$DATA" --out "$OUT/target" \
  --results "$OUT/results.json" "${TARGET_ARGS[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ] || [ ! -f "$OUT/target/model.safetensors" ]; then
  say "target failed (exit $rc)"; exit 1
fi

LEFT=$((DEADLINE - $(date +%s)))
say "draft: training ($LEFT s left before the hard stop)"
timeout -k 5 "$LEFT" "$PY" test/demo/train.py draft --data "$DATA" --target "$OUT/target" --out "$OUT/draft" \
  --results "$OUT/results.json" "${DRAFT_ARGS[@]}" 2>&1 | tee -a "$LOG"
drc=${PIPESTATUS[0]}
[ "$drc" = 0 ] || say "draft failed or was stopped (exit $drc); the target's output stands"
say "done in $(( $(date +%s) - START )) s"
ls -la "$OUT" "$OUT"/target "$OUT"/draft 2>/dev/null | tee -a "$LOG"

if [ "$SMOKE" = 1 ] && [ -x bin/dflash-model ]; then
  say "smoke: converting with bin/dflash-model"
  bin/dflash-model convert "$OUT/target" "$OUT/demo-target-q8_0.gguf" --type q8_0 --tokenizer test/demo/tokenizer --name demo-target 2>&1 | tee -a "$LOG"
  bin/dflash-model inspect "$OUT/demo-target-q8_0.gguf" 2>&1 | head -40 | tee -a "$LOG"
  bin/dflash-model convert "$OUT/draft" "$OUT/demo-draft-q8_0.gguf" --type q8_0 --name demo-draft 2>&1 | tee -a "$LOG"
  bin/dflash-model inspect "$OUT/demo-draft-q8_0.gguf" 2>&1 | head -40 | tee -a "$LOG"
  if [ -f bin/lib/libdflash_cpu.so ] && command -v go >/dev/null; then
    say "smoke: target logits and captures, PyTorch vs the CPU engine (f32 GGUF)"
    "$PY" test/demo/parity_ref.py "$OUT/target" "$OUT/parity_ref.json" 2>&1 | tee -a "$LOG"
    bin/dflash-model convert "$OUT/target" "$OUT/demo-target-f32.gguf" --type f32 --tokenizer test/demo/tokenizer 2>&1 | tee -a "$LOG"
    DEMO_PARITY_GGUF="$(realpath "$OUT/demo-target-f32.gguf")" DEMO_PARITY_REF="$(realpath "$OUT/parity_ref.json")" \
      DFLASH_LIB_DIR="$PWD/bin/lib" go test -count=1 -v -run Parity ./test/demo/ 2>&1 | grep -v '^=== ' | tee -a "$LOG"
  fi
fi
exit "$drc"
