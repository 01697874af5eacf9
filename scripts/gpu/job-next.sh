#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 17:5x (~14 device minutes; this session's device time went to one job at 15:5x and to machines that did
# not start). (0) `sass`: which kernels still load through the non-coherent path before their PDL wait with the GPU
# machine's ptxas (nvcc 11.8 hoisted three activation loads of gemv_q8p_ahead_kernel<1, 8> above it: the likely cause of
# the one ds4 op failure of 15:5x; the one-token GEMVs now read activations through ld_act). (1) quick with both opt-ins
# written without a GPU this session as TRY (DFL_CUDA_STAGE_FRAG=1: norms and attention stage their codes in the
# tensor-core products' fragment order; DFL_CUDA_ATTN_PREP_FUSED=1: decode attention does attn_prep's work itself): their
# op tests (bit for bit against the ops they replace), replays and speculative greedy with them, then qwen3-8b q8_0 and
# the 27B, decode b1 / b8 / b32 and the 16-row verify, the defaults against each alone (the defaults' b1 also tells what
# ld_act cost against 15:5x's 3.79-3.80 / 11.44-11.50 ms, another machine). (2) the ds4 case of 15:5x 8 times each with
# the defaults, without the one-row staged GEMV and without any; initcheck and racecheck on it.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "sass" \
  "TRY=DFL_CUDA_STAGE_FRAG=1,DFL_CUDA_ATTN_PREP_FUSED=1 DFLASH_BENCH_BATCHES=1,8,32 BENCH_FILTER='GGUF/(tg|vf-b1)' QUICK_VARIANTS='- DFL_CUDA_STAGE_FRAG=1 DFL_CUDA_ATTN_PREP_FUSED=1 -' quick qwen3-8b:q8_0 qwen3.5-27b:q8_0" \
  "REPEAT_N=8 REPEAT_TOOLS='initcheck racecheck' REPEAT_VARIANTS='- DFL_CUDA_GEMV_AHEAD_R1=0 DFL_CUDA_GEMV_AHEAD=0' repeat"
