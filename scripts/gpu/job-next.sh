#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 16:3x (the session's last ~4 device minutes after failed starts): (2)'s op tests and decode
# A/B first (slim), then quick's end-to-end checks, then (1) the one failure of the H100 15:5x job (test_cuda_ds4's "hc_pre_norm's
# product = rmsnorm's (GPU) T=1 D=4096 norm folded": bits differ, where the same ops without the folded norm were
# equal): is a one-token product nondeterministic? 4 runs with the defaults (no other variant: time); initcheck
# on it. (2) quick with the fragment-ordered staging (DFL_CUDA_STAGE_FRAG, default
# since this commit, written without a GPU): its op tests (bit for bit against the product's own quantizer and copy),
# replays and speculative greedy, then qwen3-8b q8_0 decode b1 / b8 with and without it.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "OPTINS=DFLASH_NOTHING=1 DFLASH_BENCH_BATCHES=1,8 BENCH_FILTER=GGUF/tg SLIM_VARIANTS='- DFL_CUDA_STAGE_FRAG=0' slim qwen3-8b:q8_0" \
  "DFLASH_BENCH_BATCHES=1,8 BENCH_FILTER=GGUF/tg QUICK_VARIANTS='- DFL_CUDA_STAGE_FRAG=0' quick qwen3-8b:q8_0" \
  "REPEAT_N=4 REPEAT_TOOLS=initcheck repeat"
