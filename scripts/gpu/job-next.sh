#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Issue 11's line is set on the H200: ask for one (kind nvidia-h200) and say which card gave each figure.
# Written 12-06 12:0x: DFL_CUDA_PDL_EARLY=1 (the product kernels trigger their dependents at their top, so the kernels
# after a product, the next product's first weight loads included, start on the SMs its last wave leaves idle; written
# without a GPU): its op tests (the matmul group), the engine's device and speculative tests with it (DeepSeek V4's
# replay included: its z-batched GEMVs take it too); the 27B layer's products at 1..32 tokens both ways (kernel bench);
# the 27B verify (8 / 16 / 23 rows, the tree) and qwen3-8b q8_0 and q4_K tg b1 / b8 / b32 (skip-ops' tg runs) with
# and without it, alternating.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "OPS_VARIANTS=DFL_CUDA_PDL_EARLY=1 ops matmul" "DFL_CUDA_PDL_EARLY=1 spec-checks" \
  "DFL_BENCH_LAYER=qwen35-27b DFL_BENCH_TOKENS='1 8 16 24 32' KERNEL_VARIANTS='- DFL_CUDA_PDL_EARLY=1' kbench" \
  "SPEC_VARIANTS='- DFL_CUDA_PDL_EARLY=1 - DFL_CUDA_PDL_EARLY=1' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "SKIP_VARIANTS='- DFL_CUDA_PDL_EARLY=1 - DFL_CUDA_PDL_EARLY=1' skip-ops qwen3-8b:q8_0 qwen3-8b:q4_K"
