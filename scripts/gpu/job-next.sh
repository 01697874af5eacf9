#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu; llama.cpp builds beside the checks, then runs beside slim); poll with
# scripts/gpu/bg.sh wait 560. `check` runs the op tests and replays with UNMEASURED's opt-ins too.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "peer" "check" \
  "KERNEL_VARIANTS='- DFL_CUDA_Q4K_STREAM=0 DFL_CUDA_Q4K_STREAM_UNITS=8' DFL_BENCH_TOKENS='1 8 16 24 32' kbench" \
  "NCU_CASES='q4_K:32 q8_0:8' ncu" \
  "SLIM_VARIANTS='- DFL_CUDA_Q4K_STREAM=0 DFL_CUDA_Q4K_STREAM_UNITS=8 DFL_CUDA_Q4K_STREAM_UNITS=12 -' OPTINS=DFLASH_NOTHING=1 BENCH_FILTER=GGUF/tg DFLASH_BENCH_BATCHES=1,8,32 slim qwen3-8b:q4_K qwen3-8b:q8_0" \
  "SKIP_VARIANTS='- DFL_CUDA_SKIP_OPS=matmul DFL_CUDA_SKIP_OPS=attention+attn_prep DFL_CUDA_SKIP_OPS=add_rmsnorm+rmsnorm+swiglu DFL_CUDA_SKIP_OPS=topk+embed+add+gather_rows DFL_CUDA_SKIP_OPS=matmul+attention+attn_prep+add_rmsnorm+rmsnorm+swiglu+topk+embed+add+gather_rows' DFLASH_BENCH_BATCHES=32 skip-ops qwen3-8b:q4_K qwen3-8b:q8_0" \
  "SPEC_VARIANTS='- -' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench"
