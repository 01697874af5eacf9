#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 14:4x: the staged-ahead GEMV as the default (DFL_CUDA_GEMV_AHEAD=8 with the one-row products): quick's
# op tests, device replay, BenchmarkGGUF of the qwen3-8b pair and speculative greedy == plain greedy, then the op tests
# of the kernels it replaced (DFL_CUDA_GEMV_AHEAD=0) and qwen3-8b q8_0 tg b1 against them, alternating.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "quick" \
  "OPS_VARIANTS='DFL_CUDA_GEMV_AHEAD=0' ops matmul" \
  "DFLASH_BENCH_BATCHES=1 SKIP_VARIANTS='- DFL_CUDA_GEMV_AHEAD=0 - DFL_CUDA_GEMV_AHEAD=0' skip-ops qwen3-8b:q8_0"
