#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Issue 11's line is set on the H200: ask for one (kind nvidia-h200) and say which card gave each figure.
# Written 12-06 10:4x: DFL_CUDA_Q8P_ROWS=1 (the staged q8_0 kernel reading the quantizer's rows itself, no
# mma_acts_kernel copy before it; written without a GPU): its op tests (the matmul group) and the engine's device and
# speculative tests with it; the 27B layer's products at 1..32 tokens both ways (kernel bench); the 27B verify (8 / 16
# / 23 rows, the tree) and qwen3-8b q8_0 tg b1 / b8 / b32 (skip-ops' tg runs) with and without it, alternating; last,
# the first and second request after a start with --warmup off and on (the warm-up's short prompts, 11:1x, unmeasured).
# Added 12-06 11:2x: ncu of the 27B layer's q8_0 products at 1 and 16 tokens (the Next section's lever 2).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "OPS_VARIANTS=DFL_CUDA_Q8P_ROWS=1 ops matmul" "DFL_CUDA_Q8P_ROWS=1 spec-checks" \
  "DFL_BENCH_LAYER=qwen35-27b DFL_BENCH_TOKENS='1 8 16 24 32' KERNEL_VARIANTS='- DFL_CUDA_Q8P_ROWS=1' kbench" \
  "NCU_CASES='q8_0:1 q8_0:16' DFL_BENCH_LAYER=qwen35-27b ncu" \
  "SPEC_VARIANTS='- DFL_CUDA_Q8P_ROWS=1 - DFL_CUDA_Q8P_ROWS=1' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "SKIP_VARIANTS='- DFL_CUDA_Q8P_ROWS=1 - DFL_CUDA_Q8P_ROWS=1' skip-ops qwen3-8b:q8_0" "first-request qwen3-8b:q8_0"
