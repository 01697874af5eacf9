#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 10:5x (~8 device minutes). DeepSeek V4's batch-1 chain after the 09:5x ncu window (a layer ~207 us of
# kernels each alone: the two HC sites 17 us each, the router 9, the attention's combine 9, three quantizers 3 each):
# (1) two opt-ins written without a GPU, DFL_CUDA_HC_SITE_LATE=1 (Sinkhorn after rank 0's share of y, a split cluster
# barrier) and DFL_CUDA_MOE_ROUTE_QUANT=1 (the router's other warps stage the experts' int8 input: one quantizer fewer),
# with the three launch cuts of 12-05 that were within that day's noise (DFL_CUDA_DS4_ATTN_QUANT=1, DFL_CUDA_DS4_CHAIN=1,
# DFL_CUDA_MOE_COMBINE_POST=1; the step's spread is ~0.5 % now): all five together through the op tests, replay and
# goldens; (2) decode alternated, each apart and all together, twice; (3) Nsight Compute's sections of the small kernels
# (which stall where) for the next changes.
cd "$(dirname "$0")/../.."
all=DFL_CUDA_HC_SITE_LATE=1,DFL_CUDA_MOE_ROUTE_QUANT=1,DFL_CUDA_DS4_ATTN_QUANT=1,DFL_CUDA_DS4_CHAIN=1,DFL_CUDA_MOE_COMBINE_POST=1
steps=()
steps+=("TRY=$all DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=1 ds4-try")
steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_VARIANTS='- ${all//,/ } $all' ds4-decode-ab")
steps+=("DS4_LAYERS=2 ds4-ncu")
exec scripts/gpu/bg.sh start "${steps[@]}"
