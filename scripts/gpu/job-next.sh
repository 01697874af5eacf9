#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures, on an H200 only:
# the card issues 10, 11 and 13 name); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-07 16:4x (~8 device minutes and the start on an H100, ~14 on an H200; the V4 file is made with
# --distinct-rows now, in well under a minute where it took more than 4). A 4-layer V4-Flash file (its fourth layer
# routed): the routed experts' q4_K z batches
# two and four rows a warp (DFL_CUDA_MOE_ROWS=2 / 4, unmeasured) and one token of wide q8_0 matrices (wq_b: rows of
# 1,024; the head) four rows a warp (DFL_CUDA_Q8P_ROWS1_R=4), op tests (the moe group's rows of several super-blocks),
# replay, goldens, decode b1 / b8 / b32 alternated twice (the direct MoE path's 256 pairs now the default); on an H200
# llama.cpp on the same file, then the 27B's decode and verify; last, where a b8 step's kernel time goes (ncu).
cd "$(dirname "$0")/../.."
steps=()
h200=
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && h200=1
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || [ -z "$h200" ] || steps+=(peer)
steps+=("TRY='DFL_CUDA_MOE_ROWS=2 DFL_CUDA_MOE_ROWS=4 DFL_CUDA_Q8P_ROWS1_R=4' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
# on an H200 (issues 10, 11 and 13 name it) llama.cpp on the V4 file, then the 27B's decode (llama.cpp beside it with
# PEER=1) and its verify blocks (~5 device minutes more)
if [ -n "$h200" ]; then
  [ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=4 ds4-peer")
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
# where a b8 step's kernel time goes (each kernel alone, graphs off; ~2 minutes)
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 STEP_BATCHES=8 NCU_SKIP=1500 NCU_COUNT=1500 NCU_STEP_LIST=90 step-ncu ds4-L4:q8_0")
exec scripts/gpu/bg.sh start "${steps[@]}"
