#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 12:1x (~9 device minutes). A 4-layer V4-Flash file (its fourth layer routed), with the 12:0x defaults
# (Sinkhorn on the side lane, its sums unrolled; the router by rank): op tests (the hc_site group's check of the
# site's scaled mixing row is new), replay, goldens, and decode alternated against hc_post's partial sums
# (DFL_CUDA_HC_PARTS=1: -1.3 % at one token at 11:2x, before the side-lane Sinkhorn) and the router's f32 product
# loaded ahead of its PDL wait (DFL_CUDA_GEMV_F32_AHEAD=1) and the grouped wo_a on the staged-ahead q8_0 kernel
# (DFL_CUDA_GROUPED_AHEAD=1); then each kernel of the 4-layer step alone. On an H200 the 27B's figures first.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
# on an H200 (issues 10 and 11 name it; none lent since 12-07 06:0x) first the 27B's decode (llama.cpp beside it with
# PEER=1) and its verify blocks (~5 device minutes more)
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
steps+=("TRY='DFL_CUDA_HC_PARTS=1 DFL_CUDA_GEMV_F32_AHEAD=1 DFL_CUDA_GROUPED_AHEAD=1' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 ds4-try")
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 NCU_SKIP=400 NCU_COUNT=900 step-ncu ds4-L4:q8_0")
exec scripts/gpu/bg.sh start "${steps[@]}"
