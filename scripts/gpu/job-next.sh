#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu; llama.cpp builds beside the checks, then runs beside slim); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). `check` runs the new defaults
# (stream-K halves on, DFL_CUDA_Q4K_STREAM_UNITS=0) and the replays that now read the captures in place; slim sets them
# beside the old ones and llama.cpp; spec-bench times the 27B verify with its captures read in place (the default,
# as the server does), copied out (DFLASH_BENCH_CAPTURE_COPY=1, the old way) and none, then profiles vf16 and vt23.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "peer" "check" \
  "SLIM_VARIANTS='- DFL_CUDA_STREAM_HALVES=0,DFL_CUDA_Q4K_STREAM_UNITS=12 -' OPTINS=DFLASH_NOTHING=1 BENCH_FILTER=GGUF/tg DFLASH_BENCH_BATCHES=1,8,32 slim qwen3-8b:q4_K qwen3-8b:q8_0" \
  "SPEC_VARIANTS='- DFLASH_BENCH_CAPTURE_COPY=1 DFLASH_BENCH_CAPTURE=0 -' SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench"
