#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 16:1x (~7 device minutes): the one failure of the H100 15:5x job (test_cuda_ds4's "hc_pre_norm's
# product = rmsnorm's (GPU) T=1 D=4096 norm folded": bits differ, where the same sequence of ops without the folded norm
# was equal): is a one-token product nondeterministic? 30 runs with the defaults, without the one-row staged GEMV, without
# any, without PDL; the sanitizers on it. Then what the fragment-ordered activation copies (mma_acts), attention and the norms cost in
# replayed steps at batch 1 and 8 today (the copies: a fold into the op before the product is the next lever).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "REPEAT_N=30 REPEAT_VARIANTS='- DFL_CUDA_GEMV_AHEAD_R1=0 DFL_CUDA_GEMV_AHEAD=0 DFL_CUDA_PDL=0' repeat" \
  "DFLASH_BENCH_BATCHES=1,8 SKIP_VARIANTS='- DFL_CUDA_SKIP_OPS=mma_acts DFL_CUDA_SKIP_OPS=attention+attn_prep DFL_CUDA_SKIP_OPS=add_rmsnorm -' skip-ops qwen3-8b:q8_0 qwen3-8b:q4_K qwen3.5-27b:q8_0"
