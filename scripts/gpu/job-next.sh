#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Issue 11's line is set on the H200: ask for one (kind nvidia-h200) and say which card gave each figure.
# Written 12-06 12:0x, without a GPU (the session's device time spent):
# - DFL_CUDA_PDL_EARLY=1 (the staged and streamed products of more than one wave trigger their dependents at their
#   top) and =2 (every staged and streamed product): every product early, the one-token GEMVs included, won on the
#   27B verify and lost on qwen3-8b tg (11:4x). qwen3-8b q8_0 and q4_K (its stream kernel takes it too) tg b1 / b8 /
#   b32 and the 27B verify (8 / 16 / 23 rows, the tree) with each, alternating with the defaults. Its op tests and the
#   device and speculative tests passed at 11:4x with every product early (a superset of these triggers).
# - DFL_CUDA_Q8P_ROWS1_MIN=6000: the 27B's 5120-row matrices (out, o, down) at one token on gemv_q8p_kernel (a row a
#   warp, 640 blocks) instead of the rows kernel (two rows a warp, 320 blocks; 29 % occupancy in ncu, 11:3x): the 27B
#   decode step (spec-bench's tg-b1) with it.
# - prefill chunks no longer replayed from graphs (qwen.cpp) and the warm-up's decoding request last: the device and
#   speculative tests with the defaults, then the first, second (and third) request after a start (first-request).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "spec-checks" \
  "SKIP_VARIANTS='- DFL_CUDA_PDL_EARLY=1 DFL_CUDA_PDL_EARLY=2 - DFL_CUDA_PDL_EARLY=1 DFL_CUDA_PDL_EARLY=2' skip-ops qwen3-8b:q8_0 qwen3-8b:q4_K" \
  "SPEC_VARIANTS='- DFL_CUDA_PDL_EARLY=1 DFL_CUDA_PDL_EARLY=2 DFL_CUDA_Q8P_ROWS1_MIN=6000 - DFL_CUDA_PDL_EARLY=1 DFL_CUDA_PDL_EARLY=2 DFL_CUDA_Q8P_ROWS1_MIN=6000' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "first-request qwen3-8b:q8_0"
