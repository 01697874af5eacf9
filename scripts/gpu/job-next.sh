#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go
# after ~30 s idle). Issue 10's lines are measured side by side with llama.cpp in the same job; say which card gave them.
# Written 12-06 13:0x, after the 12:5x job made the early trigger of multi-wave staged / streamed products the default
# (DFL_CUDA_PDL_EARLY): decode at batch 1 / 8 / 32 of qwen3-8b q8_0, q4_K and the 27B q8_0 with it and without
# (alternating), then llama.cpp's llama-bench and llama-batched-bench on the same files (built in the background from
# the first step on).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "peer" \
  "SKIP_VARIANTS='- DFL_CUDA_PDL_EARLY=0 - DFL_CUDA_PDL_EARLY=0' skip-ops qwen3-8b:q8_0 qwen3-8b:q4_K qwen3.5-27b:q8_0"
