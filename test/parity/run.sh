#!/usr/bin/env bash
# Regenerates the parity goldens and checks the CPU engine against them.
#
# Run from anywhere on a machine with PyTorch and transformers (>= 5.2; goldens in testdata were made with 5.17):
#   test/parity/run.sh [OUT_DIR]            (default OUT_DIR: test/parity/testdata)
# It needs bin/dflash-model (go build -o bin/dflash-model ./cmd/dflash-model). When bin/parity.test
# (go test -c -o bin/parity.test ./test/parity) and bin/lib/libdflash_cpu.so are present too, the engine is checked
# against the fresh goldens right away, so a machine without Go can do the whole round.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-test/parity/testdata}
if [ ! -x bin/dflash-model ]; then
	echo "bin/dflash-model is missing: go build -o bin/dflash-model ./cmd/dflash-model" >&2
	exit 1
fi
mkdir -p "$out"
python3 test/parity/make_goldens.py --out "$out" --convert bin/dflash-model
python3 test/parity/make_goldens_ds4.py --out "$out" --convert bin/dflash-model
if [ -x bin/parity.test ] && [ -f bin/lib/libdflash_cpu.so ]; then
	DFLASH_PARITY_DIR="$(cd "$out" && pwd)" DFLASH_LIB_DIR="$(pwd)/bin/lib" bin/parity.test -test.v -test.run Parity
fi
