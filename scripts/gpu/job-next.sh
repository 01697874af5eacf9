#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer for llama.cpp beside ds4-bench at the end); poll with scripts/gpu/bg.sh wait
# 420 back to back (the machine is let go after ~30 s idle). Issue 11's line is set on the H200: ask for one
# (kind nvidia-h200) and say which card gave each figure.
# Written 12-06 08:5x: where a 16-row verify and the tree spend their time beyond a decode step, by kind of op, inside
# the replayed graphs (skip-ops: a skipped op launches nothing, the output is garbage); then the kernel bench (the 27B
# layer's products at 1..32 tokens: how much slower a token of 16 is than one alone); last, DeepSeek V4 on 3 layers
# beside llama.cpp (issue 13's b8 margin was thin on the H200: 1.06x); then the load's warm-up request (--warmup, auto:
# on a GPU): the first and second request's time to first token after a start with it off and on, the demo model and
# qwen3-8b q8_0, and each start's time to /ready (unmeasured on a GPU).
cd "$(dirname "$0")/../.."
skip='DFL_CUDA_SKIP_OPS=gdn+conv1d_silu DFL_CUDA_SKIP_OPS=matmul DFL_CUDA_SKIP_OPS=attention+attn_prep'
skip="$skip DFL_CUDA_SKIP_OPS=add_rmsnorm+rmsnorm+gated_rmsnorm DFL_CUDA_SKIP_OPS=gdn_gates+sigmoid_mul+swiglu"
exec scripts/gpu/bg.sh start "peer" \
  "SPEC_VARIANTS='- $skip -' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "KERNEL_VARIANTS=- kbench" \
  "DS4_LAYERS=3 DS4_FUSED_MODES=1 ds4-bench" "first-request qwen3-8b:q8_0"
