#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 14:5x: the matmul op tests with DFL_CUDA_Q4K_AHEAD=1 (one-token q4_K products staged ahead, opt-in) and
# the defaults (the staged-ahead q8_0 GEMV, default since 584d5a3), qwen3-8b q4_K tg b1 with and without it,
# alternating (~5 device minutes). Left for a later job: quick's end-to-end checks of the defaults (device replay,
# speculative greedy == plain greedy) with the staged q8_0 GEMV.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "OPS_VARIANTS='DFL_CUDA_Q4K_AHEAD=1' ops matmul" \
  "DFLASH_BENCH_BATCHES=1 SKIP_VARIANTS='- DFL_CUDA_Q4K_AHEAD=1 - DFL_CUDA_Q4K_AHEAD=1' skip-ops qwen3-8b:q4_K"
