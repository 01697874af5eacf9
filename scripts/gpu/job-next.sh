#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 16:2x (~7 device minutes: what the session had left): (1) the one failure of the H100 15:5x job (test_cuda_ds4's "hc_pre_norm's
# product = rmsnorm's (GPU) T=1 D=4096 norm folded": bits differ, where the same ops without the folded norm were
# equal): is a one-token product nondeterministic? 5 runs each with the defaults and without the one-row staged
# GEMV; initcheck on it. (2) quick with the fragment-ordered staging (DFL_CUDA_STAGE_FRAG, default
# since this commit, written without a GPU): its op tests (bit for bit against the product's own quantizer and copy),
# replays and speculative greedy, then decode b1 / b8 and the 16-row verify with and without it.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "REPEAT_N=5 REPEAT_TOOLS=initcheck REPEAT_VARIANTS='- DFL_CUDA_GEMV_AHEAD_R1=0' repeat" \
  "DFLASH_BENCH_BATCHES=1,8 BENCH_FILTER='GGUF/(tg|vf-b1)' QUICK_VARIANTS='- DFL_CUDA_STAGE_FRAG=0' quick qwen3-8b:q8_0 qwen3.5-27b:q8_0"
