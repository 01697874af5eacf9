#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 17:2x (~13 device minutes; this session's device time went to one job at 15:5x and to machines that did
# not start). (1) quick with both opt-ins written without a GPU this session as TRY (DFL_CUDA_STAGE_FRAG=1: norms and
# attention stage their codes in the tensor-core products' fragment order; DFL_CUDA_ATTN_PREP_FUSED=1: decode attention
# does attn_prep's work itself): their op tests (bit for bit against the ops they replace), replays and speculative
# greedy with them, then qwen3-8b q8_0 and the 27B, decode b1 / b8 / b32 and the 16-row verify, the defaults against
# each alone. (2) the one failure of the H100 15:5x job (test_cuda_ds4's "hc_pre_norm's product = rmsnorm's (GPU) T=1
# D=4096 norm folded": bits differ, where the same ops without the folded norm gave equal bits): is a one-token product
# nondeterministic? 8 runs each with the defaults, without the one-row staged GEMV and without any; initcheck and
# racecheck on it.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "TRY=DFL_CUDA_STAGE_FRAG=1,DFL_CUDA_ATTN_PREP_FUSED=1 DFLASH_BENCH_BATCHES=1,8,32 BENCH_FILTER='GGUF/(tg|vf-b1)' QUICK_VARIANTS='- DFL_CUDA_STAGE_FRAG=1 DFL_CUDA_ATTN_PREP_FUSED=1 -' quick qwen3-8b:q8_0 qwen3.5-27b:q8_0" \
  "REPEAT_N=8 REPEAT_TOOLS='initcheck racecheck' REPEAT_VARIANTS='- DFL_CUDA_GEMV_AHEAD_R1=0 DFL_CUDA_GEMV_AHEAD=0' repeat"
