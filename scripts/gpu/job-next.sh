#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures; the H200 is
# the card issues 10, 11 and 13 name); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-07 22:1x (~8 device minutes on an H200 with PEER=1; V4_ONLY=1 leaves out the 27B, ~5 minutes less). The
# 10-layer V4-Flash file's decode (llama.cpp beside it with PEER=1: issue 13's figures on its card), then each kernel
# of its one-token step under ncu (which later-layer products run below copy, and what the ~0.26 ms a step that does
# not grow with layers is: cuda-notes Next 21:4x); on an H200 the 27B's decode and verify (issues 10 and 11).
cd "$(dirname "$0")/../.."
steps=()
h200=
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && h200=1
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_VARIANTS=- ds4-decode-ab")
[ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=10 ds4-peer")
# the 16:5x form (a b8 step of 4 layers then) for one token of 10 layers: ~400 launches a step
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 STEP_BATCHES=1 NCU_SKIP=2000 NCU_COUNT=1200 step-ncu ds4-L10:q8_0")
if [ -n "$h200" ] && [ -z "${V4_ONLY:-}" ]; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
exec scripts/gpu/bg.sh start "${steps[@]}"
