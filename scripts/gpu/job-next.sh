#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-08 02:2x (~7 device minutes on an H100): DeepSeek V4's unsplit attention (batch 8 and up: 512+ (token,
# head) blocks) with each tile's key rows in shared memory by cp.async (DFL_CUDA_DS4_ATTN_SMEM=1; the default keeps
# them in L2 there, measured before the async copy existed): the 01:3x trace had that kernel at ~59 us a layer of the
# b8 step, ~11 % of it; with it, two splits a (token, head) at every batch (DFL_CUDA_DS4_ATTN_MIN_SPLITS=2: 1,024
# blocks at b8); each checked (op tests, replay, goldens) and alternated twice at b1 / b8 / b32 on the 10-layer file.
# Then step-gap: the GPU's idle time between replayed decode steps (the V4 file and qwen3-8b q8_0, b1 and b8).
cd "$(dirname "$0")/../.."
steps=("TRY='DFL_CUDA_DS4_ATTN_SMEM=1 DFL_CUDA_DS4_ATTN_SMEM=1,DFL_CUDA_DS4_ATTN_MIN_SPLITS=2' DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
steps+=("DS4_LAYERS=10 step-gap ds4-L10:q8_0 qwen3-8b:q8_0")
exec scripts/gpu/bg.sh start "${steps[@]}"
