#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go
# after ~30 s idle). Say which card gave each figure.
# Written 12-06 15:2x (~12 device minutes): llama.cpp's CUDA build in the background; quick's end-to-end checks of the
# defaults with the staged-ahead q8_0 GEMV (default since 584d5a3, measured and op-tested at 14:3x but not yet through
# the device replay and speculative greedy == plain greedy); then decode of the three files with and without it,
# alternating, llama.cpp on the same files at the end (same-job ratios for the standing table).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "peer" \
  "quick" \
  "SKIP_VARIANTS='- DFL_CUDA_GEMV_AHEAD=0 - DFL_CUDA_GEMV_AHEAD=0' skip-ops qwen3-8b:q8_0 qwen3-8b:q4_K qwen3.5-27b:q8_0"
