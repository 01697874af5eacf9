#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 19:2x (~8 device minutes). The fragment staging (DFL_CUDA_STAGE_FRAG) is now the default from 8 rows
# (the repacked q8_0 products' tensor-core range) and the fused decode attention prep is deleted: (1) the 27B verify
# blocks with and without it (issue 11's line); (2) what add_rmsnorm costs inside a replayed qwen3-8b q8_0 b1 step
# now that the products after it stage their weights before their wait (0.33 ms of 3.45 on an H200 at 12-04, before
# that): whether folding it into the products is worth writing; (3) quick with the new defaults and with
# DFL_CUDA_STAGE_FRAG=0 as TRY (op tests, replays, speculative greedy both ways), then qwen3-8b q8_0 and the 27B decode
# b1 / b8 / b32 alternating. On an H200 put "peer" first (pack.sh --peer): the same-job llama.cpp figures.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- DFL_CUDA_STAGE_FRAG=0 -' spec-bench" \
  "DFLASH_BENCH_BATCHES=1 SKIP_VARIANTS='- DFL_CUDA_SKIP_OPS=add_rmsnorm - DFL_CUDA_SKIP_OPS=add_rmsnorm DFL_CUDA_SKIP_OPS=attn_prep' skip-ops qwen3-8b:q8_0" \
  "TRY=DFL_CUDA_STAGE_FRAG=0 DFLASH_BENCH_BATCHES=1,8,32 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- DFL_CUDA_STAGE_FRAG=0 -' quick qwen3-8b:q8_0 qwen3.5-27b:q8_0"
