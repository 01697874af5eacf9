#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 09:4x (~5 device minutes). (1) The HC site's cluster kernel and the attention's tiles by cp.async are
# the defaults since 09:4x: their op tests, replay and goldens with them and without (=0, the fallbacks; the
# three-op site's f16 bound is now 1e-3), then decode alternated; (2) Nsight Compute's time of each kernel of DeepSeek
# V4's batch-1 step, each alone (2-layer file, graphs off): a one-token context, so that every forward of the window is
# a decode step (09:3x's window of a 16-token context fell in the sparse prefill's per-expert products); (3) the
# replayed step with each op left out (DFL_CUDA_SKIP_OPS), the new defaults' breakdown.
cd "$(dirname "$0")/../.."
steps=()
steps+=("TRY=DFL_CUDA_HC_SITE=0,DFL_CUDA_DS4_ATTN_ASYNC=0 DS4_LAYERS=2 NO_PROFILE=1 ds4-try")
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 NCU_SKIP=200 NCU_COUNT=600 step-ncu ds4-L2:q8_0")
sk=DFL_CUDA_SKIP_OPS
skip="- $sk=hc_site $sk=hc_post $sk=ds4_attention $sk=rmsnorm $sk=moe_route $sk=moe_experts $sk=swiglu_clamp"
skip+=" $sk=matmul_grouped $sk=norm_rope_tail $sk=hc_head $sk=embed -"
steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='$skip' ds4-decode-ab")
exec scripts/gpu/bg.sh start "${steps[@]}"
