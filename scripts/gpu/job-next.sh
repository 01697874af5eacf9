#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-08 02:5x (~10 device minutes on an H100): DeepSeek V4's attention, ~59 / ~79 us a window / CSA layer of
# the traced b8 step (~13 % of it) and ~15 / ~46 at b1 (CUPTI trace 12-08 01:3x), four ways against the defaults:
# the grouped-heads kernel (DFL_CUDA_DS4_ATTN_GROUP=8 / 4: a key tile copied once for 8 / 4 heads, split for two
# blocks an SM); the (token, head) kernel's unsplit batches with the key rows in shared memory by cp.async
# (DFL_CUDA_DS4_ATTN_SMEM=1; the default keeps them in L2 there, measured before the async copy existed), alone and
# with two splits (DFL_CUDA_DS4_ATTN_MIN_SPLITS=2); each checked (op tests, replay, goldens) and alternated twice at
# b1 / b8 / b32 on the 10-layer file.
# Then step-gap: the GPU's idle time between replayed decode steps (the V4 file and qwen3-8b q8_0, b1 and b8).
cd "$(dirname "$0")/../.."
steps=()
h200=
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && h200=1
# on an H200 (the card the issues name) with pack.sh --peer and PEER=1: llama.cpp's build first, its V4 figures last
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || [ -z "$h200" ] || steps+=(peer)
steps+=("TRY='DFL_CUDA_DS4_ATTN_GROUP=8 DFL_CUDA_DS4_ATTN_GROUP=4 DFL_CUDA_DS4_ATTN_SMEM=1 DFL_CUDA_DS4_ATTN_SMEM=1,DFL_CUDA_DS4_ATTN_MIN_SPLITS=2' DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
steps+=("DS4_LAYERS=10 step-gap ds4-L10:q8_0 qwen3-8b:q8_0")
[ -z "$h200" ] || [ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=10 ds4-peer")
exec scripts/gpu/bg.sh start "${steps[@]}"
