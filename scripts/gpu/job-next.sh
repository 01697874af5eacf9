#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 14:3x, 14:5x (~7 device minutes and the start). A 4-layer V4-Flash file (its fourth layer routed): the
# grouped wo_a's group launches (the default for 2..16 tokens since 6693409) for up to 64 tokens in passes of 16
# (DFL_CUDA_GROUPED_ROWS=64, unmeasured) and for one token too (DFL_CUDA_GROUPED_ROWS1=1, unmeasured), and 16-bit
# products of up to 8 tokens on the GEMV (DFL_CUDA_GEMV16_TOKENS=8, unmeasured: V4's f16 compressor and indexer
# products at b8) and the routed down with the combine in one launch (DFL_CUDA_MOE_DOWN_COMBINE=1, unmeasured): op tests (the grouped group's 20-token case; the matmul group's f16 / bf16 cases of 2..8 tokens),
# replay, goldens, decode b1 / b8 / b32 alternated twice; each the default if it passes and wins.
# On an H200 the 27B's figures after them (the V4 steps first: a session short of device time polls them first).
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("TRY='DFL_CUDA_GROUPED_ROWS=64 DFL_CUDA_GROUPED_ROWS1=1 DFL_CUDA_GEMV16_TOKENS=8 DFL_CUDA_MOE_DOWN_COMBINE=1' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
# each kernel of a one-token step alone with the one-token opt-ins on (the down + combine's and the group launch's
# times beside the z batches' in the 12:5x list; ~20 s)
steps+=("DFL_CUDA_MOE_DOWN_COMBINE=1 DFL_CUDA_GROUPED_ROWS1=1 NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 STEP_BATCHES=1 NCU_SKIP=400 NCU_COUNT=900 step-ncu ds4-L4:q8_0")
# on an H200 (issues 10 and 11 name it; none lent since 12-07 06:0x) then the 27B's decode (llama.cpp beside it with
# PEER=1) and its verify blocks (~5 device minutes more)
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
# with PEER=1, llama.cpp on the same 4-layer file last (issue 13's "faster than llama.cpp", not rerun since 12-06)
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=4 ds4-peer")
exec scripts/gpu/bg.sh start "${steps[@]}"
