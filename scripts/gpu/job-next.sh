#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 15:4x–16:0x (~6 device minutes and the start; a fresh machine makes the 15 GB V4 file in more than 4 minutes,
# beside the op tests). A 4-layer V4-Flash file (its fourth layer routed): V4's direct MoE path for up to 256 (token,
# choice) pairs, sorted by expert on the device past 64 (DFL_CUDA_MOE_DIRECT_PAIRS=256, unmeasured: a b32 step's 192 pairs replay instead of grouping by
# expert on the host), op tests (the norms / matmul group with the repacked parts' bound; the moe group's 240-pair case
# on the direct path), replay, goldens, decode b1 / b8 / b32 alternated twice; the default if it passes and wins.
# On an H200 the 27B's figures after them (the V4 steps first: a session short of device time polls them first).
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("TRY='DFL_CUDA_MOE_DIRECT_PAIRS=256' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
# on an H200 (issues 10 and 11 name it; none lent since 12-07 06:0x) then the 27B's decode (llama.cpp beside it with
# PEER=1) and its verify blocks (~5 device minutes more)
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
exec scripts/gpu/bg.sh start "${steps[@]}"
