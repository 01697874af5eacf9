#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu; llama.cpp builds beside the checks, then runs beside slim and ds4-bench);
# poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). On an H200 where one is
# lent: the issues name it. `check`, with the unrun DFL_CUDA_GDN_PARALLEL=1 (the Gated DeltaNet of a recording entry
# in parallel form) in its UNMEASURED pass, and the spec checks (greedy equality on the GPU) with it; qwen3-8b beside
# llama.cpp; the 27B verify of 8 / 16 / 23 rows and the 23-node tree with it and without, with their per-op profiles;
# what gdn and conv each cost inside the replayed graph (skip-ops; the parallel form beside the staged kernel);
# last, DeepSeek V4 on 3 layers beside llama.cpp (its file takes minutes to make).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "peer" "UNMEASURED=DFL_CUDA_GDN_PARALLEL=1 check" "DFL_CUDA_GDN_PARALLEL=1 spec-checks" \
  "SLIM_VARIANTS='- -' OPTINS=DFLASH_NOTHING=1 BENCH_FILTER=GGUF/tg DFLASH_BENCH_BATCHES=1,8,32 slim qwen3-8b:q4_K qwen3-8b:q8_0" \
  "SPEC_VARIANTS='- DFL_CUDA_GDN_PARALLEL=1 -' SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "SPEC_VARIANTS='DFL_CUDA_SKIP_OPS=gdn DFL_CUDA_SKIP_OPS=conv1d_silu DFL_CUDA_GDN_PARALLEL=1,DFL_CUDA_SKIP_OPS=conv1d_silu' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "DS4_LAYERS=3 DS4_FUSED_MODES=1 ds4-bench"
