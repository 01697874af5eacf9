#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures; the H200 is
# the card issues 10, 11 and 13 name); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-08 00:3x (~5 device minutes on an H100): DeepSeek V4's kept FFN-input codes, now the default for batched
# steps only (b8 -1.3 %, b1 +1.5 % at 00:1x), checked (op tests, device replay, goldens) and timed against
# DFL_CUDA_KEEP_QUANT=0 on the 10-layer file at b1 / b8 (one run: one token runs the same code as before); then a
# CUPTI trace of its graph-replayed steps at b1 and b8 (step-trace: each kernel's cost inside the graph). On an H200 (unless V4_ONLY=1) also the file
# beside llama.cpp (with PEER=1) and the 27B's decode and verify blocks (issues 10 and 11; ~6 device minutes more),
# none run on an H200 since 12-07 06:0x.
cd "$(dirname "$0")/../.."
steps=()
h200=
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && [ -z "${V4_ONLY:-}" ] && h200=1
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || [ -z "$h200" ] || steps+=(peer)
steps+=("TRY=DFL_CUDA_KEEP_QUANT=0 DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_BATCHES=1,8 ds4-try")
steps+=("STEP_BATCHES=1 step-trace ds4-L10:q8_0" "STEP_BATCHES=8 step-trace ds4-L10:q8_0")
if [ -n "$h200" ]; then
  [ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=10 ds4-peer")
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
exec scripts/gpu/bg.sh start "${steps[@]}"
