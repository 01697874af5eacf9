#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 10:1x (~6 device minutes, the session's last). Two hc_site opt-ins written without a GPU after the
# 09:5x ncu sections (17 us a site on 8 SMs, most of it warps waiting at block barriers): DFL_CUDA_HC_PARTS=1 (hc_post
# begins the next site's mixing product: partial sums over its 64 blocks a token, so the site's kernel reads no
# weights and skips its first cluster barrier) and DFL_CUDA_HC_SITE_BLOCKS=16 (16-block clusters); their op tests,
# replay and goldens apart, decode alternated (apart, then together), then Nsight Compute's sections of the two kernels
# with the partial sums (their stall locations in SASS for the next change).
cd "$(dirname "$0")/../.."
steps=()
steps+=("TRY='DFL_CUDA_HC_PARTS=1 DFL_CUDA_HC_SITE_BLOCKS=16' DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=2 ds4-try")
steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_VARIANTS='- DFL_CUDA_HC_PARTS=1,DFL_CUDA_HC_SITE_BLOCKS=16' ds4-decode-ab")
steps+=("DFL_CUDA_HC_PARTS=1 DS4_LAYERS=2 DS4_NCU_KERNELS='hc_site_kernel|hc_post' NCU_COUNT=6 DS4_NCU_SECTIONS='--section SourceCounters' ds4-ncu")
exec scripts/gpu/bg.sh start "${steps[@]}"
