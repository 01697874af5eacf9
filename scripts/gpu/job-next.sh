#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 08:4x (~12 device minutes; ~14 with the peer). (1) The 27B tg b1 with the defaults (and llama.cpp on
# the same file with PEER=1: issue 10's same-job ratio); (2) the 27B verify blocks (8, 16, tree of 23; issue 11's
# ratios, the chains in parallel form by default since 2a1ec70); (3) Nsight Compute's time of each kernel of DeepSeek
# V4's batch-1 step (2-layer file, graphs off, each kernel alone): the 08:2x skip-ops put a layer's attention at ~28 us
# and each hc_pre at ~15 us inside a replayed step (PERFORMANCE.md), where the kernels' work is a few us; whether the
# kernels are slow or their boundaries (the split attention's 66 KB of shared memory a block reconfigures the SMs
# between a product and the next) decides the fix; (4) the attention without its shared-memory tiles
# (DFL_CUDA_DS4_ATTN_SMEM=0, split still) and without splits (DFL_CUDA_DS4_ATTN_SPLIT=0), alternated. Before (3)
# and (4): the whole HC site in one cluster kernel a token (DFL_CUDA_HC_SITE=1, written without a GPU: its op tests,
# the deepseek4 replay and goldens with it, then decode alternated; the site's three launches were ~26 us of a
# ~232 us layer, twice a layer) and the attention's key tiles by cp.async (DFL_CUDA_DS4_ATTN_ASYNC=1: one round trip a
# tile where the register copy takes eight), together; (4) then alternates each apart.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
steps+=("TRY=DFL_CUDA_HC_SITE=1,DFL_CUDA_DS4_ATTN_ASYNC=1 DS4_LAYERS=2 NO_PROFILE=1 ds4-try")
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_PREFILL=sparse DFLASH_BENCH_CONTEXT=16 NCU_SKIP=1500 NCU_COUNT=400 step-ncu ds4-L2:q8_0")
a=DFL_CUDA_DS4_ATTN
ab="- DFL_CUDA_HC_SITE=1 ${a}_ASYNC=1 ${a}_SMEM=0 ${a}_SPLIT=0"
steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_VARIANTS='$ab' ds4-decode-ab")
exec scripts/gpu/bg.sh start "${steps[@]}"
