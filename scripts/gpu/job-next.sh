#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 11:4x (~9 device minutes). A 4-layer V4-Flash file (its fourth layer routed): Sinkhorn on the device's
# side lane (DFL_CUDA_HC_COMB_SIDE=1: the site kernel's rank 0 ran it alone for ~9 of its 17-18 us, ncu 12-07 10:0x and
# 11:2x), with hc_post's partial sums (DFL_CUDA_HC_PARTS=1: -1.3 % at one token on this file, 11:2x), and the router's
# f32 product loaded ahead of its wait (DFL_CUDA_GEMV_F32_AHEAD=1): op tests, replay, goldens, decode alternated; then
# the site and the Sinkhorn kernels' ncu sections with the first two.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("TRY='DFL_CUDA_HC_COMB_SIDE=1' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 ds4-try")
exec scripts/gpu/bg.sh start "${steps[@]}"
