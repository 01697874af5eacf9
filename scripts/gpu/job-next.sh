#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 10:3x (~13 device minutes; ~15 with the peer). (1) What a thread-block cluster's launch and barriers
# cost a phase (the kernel bench's sync group, now with the HC site's shape: 8 x 512 plain, PDL, a cluster of 8, a
# cluster of 16): half of hc_site_kernel's 17-18 us passed with its SMs idle (ncu 10:0x); (2) the 27B tg b1 with the
# defaults (llama.cpp with PEER=1) and its verify blocks (issues 10 and 11; on an H200 if one is lent); (3) a 4-layer
# V4-Flash file (its fourth layer routed by the arg-max rounds, not hashed): DFL_CUDA_HC_PARTS=1 with its partial sums
# now added in parallel, and with it the site in one block a token, no cluster (DFL_CUDA_HC_SITE_ONE=1, written 10:2x):
# op tests, replay, goldens, decode alternated (and the router's top-k by rank, DFL_CUDA_MOE_ROUTE_RANK=1, whose cost
# the 2-layer file's hash layers never showed, and the attention's last split block combining, DFL_CUDA_DS4_ATTN_LAST=1); the two site kernels' ncu sections; each kernel of the step alone.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("KERNEL_VARIANTS=- kbench")
steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
steps+=("TRY='DFL_CUDA_HC_PARTS=1 DFL_CUDA_HC_PARTS=1,DFL_CUDA_HC_SITE_ONE=1 DFL_CUDA_MOE_ROUTE_RANK=1 DFL_CUDA_DS4_ATTN_LAST=1' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 ds4-try")
steps+=("DFL_CUDA_HC_PARTS=1 DFL_CUDA_HC_SITE_ONE=1 DS4_LAYERS=4 DS4_NCU_KERNELS='hc_site|hc_post' NCU_COUNT=6 ds4-ncu")
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 NCU_SKIP=400 NCU_COUNT=900 step-ncu ds4-L4:q8_0")
exec scripts/gpu/bg.sh start "${steps[@]}"
