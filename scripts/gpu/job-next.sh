#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu; llama.cpp builds beside the checks, then runs beside slim); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). `check` runs the op tests and
# replays with UNMEASURED's settings too: the chunked activations for q8_0 (DFL_CUDA_MMA_CHUNK=1; the q4_K stream
# takes them by default since 12-06 04:3x, measured in the kernel bench only) and stream-K halves for grids of at most
# one tile an SM (DFL_CUDA_STREAM_HALVES=1, written 12-06 04:4x, unrun). DFLASH_BENCH_CAPTURE=0: the 27B verify
# without its five captured layers' copy to the host (1.6 MB at 16 rows), what that copy costs of the ~0.4 ms a verify
# spends outside its layers.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "peer" "UNMEASURED='DFL_CUDA_MMA_CHUNK=1 DFL_CUDA_STREAM_HALVES=1' check" \
  "KERNEL_VARIANTS='- DFL_CUDA_MMA_CHUNK=0 DFL_CUDA_MMA_CHUNK=1 DFL_CUDA_STREAM_HALVES=1 DFL_CUDA_STREAM_HALVES=1,DFL_CUDA_Q4K_STREAM_UNITS=0' DFL_BENCH_TOKENS='1 8 16 24 32' kbench" \
  "NCU_CASES='q4_K:1 q8_0:1 q4_K:32' ncu" \
  "SLIM_VARIANTS='- DFL_CUDA_MMA_CHUNK=0 DFL_CUDA_MMA_CHUNK=1 DFL_CUDA_STREAM_HALVES=1 DFL_CUDA_STREAM_HALVES=1,DFL_CUDA_Q4K_STREAM_UNITS=0 -' OPTINS=DFLASH_NOTHING=1 BENCH_FILTER=GGUF/tg DFLASH_BENCH_BATCHES=1,8,32 slim qwen3-8b:q4_K qwen3-8b:q8_0" \
  "SPEC_VARIANTS='- DFL_CUDA_MMA_CHUNK=1 DFLASH_BENCH_CAPTURE=0 -' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench"
