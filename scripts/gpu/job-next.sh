#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then put "peer" first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-06 20:1x (~9 device minutes). (1) DFL_CUDA_RESID_NORM=2 (opt-in, written without a GPU): the residual-norm
# fold that won on qwen3-8b q8_0 b1 (19:4x, -8 %) for the 27B's 5120-row out, o and down projections too (two rows a
# warp; a 32-row group's last block quantizes it, counted in by atomics) and for q4_K files (qwen3-8b q4_K's o and
# down on the q4_K int8 GEMV, the same groups): quick on the 27B and qwen3-8b q4_K with it as TRY (the matmul op tests'
# 5120-row and q4_K fold cases, replays, speculative greedy), then decode b1 of each alternating with and without it
# (issue 10's 27B line: ~11.2 ms on an H100; q4_K b1 1.38x llama.cpp at 15:5x). (2) The 27B verify blocks with and without the fragment staging and with
# the fold (one token only: the verify is unchanged by construction, the decode step it divides by is not).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "TRY=DFL_CUDA_RESID_NORM=2 DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- DFL_CUDA_RESID_NORM=2 - DFL_CUDA_RESID_NORM=2' quick qwen3.5-27b:q8_0 qwen3-8b:q4_K" \
  "SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- DFL_CUDA_STAGE_FRAG=0 DFL_CUDA_RESID_NORM=2' spec-bench"
