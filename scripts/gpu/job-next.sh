#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 19:4x (~5 device minutes). DFL_CUDA_RESID_NORM=1 (opt-in, written without a GPU): one-token output
# projections (qwen3-8b's o and down) do the residual add and quantize the next product's input themselves, the norm's
# scale applied by that product: quick on qwen3-8b q8_0 with it as TRY (the matmul op tests' fold cases, replays,
# speculative greedy), then tg b1 alternating with and without it. If it wins, the default; then the items of the
# cuda-notes list (the 27B verify blocks with and without the fragment staging, quick on both files).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "TRY=DFL_CUDA_RESID_NORM=1 DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- DFL_CUDA_RESID_NORM=1 - DFL_CUDA_RESID_NORM=1' quick qwen3-8b:q8_0"
