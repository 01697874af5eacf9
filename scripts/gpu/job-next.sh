#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu; llama.cpp builds beside the checks, then runs beside slim and ds4-bench);
# poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). On an H200 where one is
# lent: the issues name it. `check`; qwen3-8b beside llama.cpp; the 27B verify of 8 / 16 / 23 rows and the 23-node
# tree with their per-op profiles; then what each tree-sensitive op costs inside the replayed graph (skip-ops on a
# 23-row chain, which has the tree's products, and on the tree: their difference is the tree's own cost); last,
# DeepSeek V4 on 3 layers beside llama.cpp (its file takes minutes to make).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "peer" "check" \
  "SLIM_VARIANTS='- -' OPTINS=DFLASH_NOTHING=1 BENCH_FILTER=GGUF/tg DFLASH_BENCH_BATCHES=1,8,32 slim qwen3-8b:q4_K qwen3-8b:q8_0" \
  "SPEC_VARIANTS='- -' SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "SPEC_VARIANTS='DFL_CUDA_SKIP_OPS=gdn DFL_CUDA_SKIP_OPS=conv1d_silu DFL_CUDA_SKIP_OPS=attention+attn_prep DFL_CUDA_SKIP_OPS=matmul' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "DS4_LAYERS=3 DS4_FUSED_MODES=1 ds4-bench"
