#!/usr/bin/env bash
# The job of docs/perf/cuda-notes.md's latest "Next" section, as one bg.sh job (run on the GPU machine after
# scripts/gpu/pack.sh, carry .gpu; poll with scripts/gpu/bg.sh wait 560).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "check" "spec-checks" \
  "SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- DFL_CUDA_PINNED_D2H=0 DFL_CUDA_HOST_LANDING=0 DFL_CUDA_LANES=1 DFL_CUDA_GDN_ACC=4 DFL_CUDA_Q8P_MT4=1 DFL_CUDA_STAGE_FRAGS=1 DFL_CUDA_GDN_TREE_SMEM=1 DFL_CUDA_GDN_ACC=4,DFL_CUDA_Q8P_MT4=1,DFL_CUDA_STAGE_FRAGS=1,DFL_CUDA_GDN_TREE_SMEM=1 -' spec-bench" \
  "SPEC_BATCHES=1,8 SPEC_PROFILE=0 SPEC_BENCH='DraftGGUF' SPEC_VARIANTS='- DFL_DRAFT_GRAPHS=0 -' spec-bench" \
  "NO_PROFILE=1 DS4_LAYERS=2 DS4_VARIANTS='- DFL_CUDA_LANES=1' ds4-decode-ab" \
  "SLIM_VARIANTS='- DFL_CUDA_Q8P_MT4=1 DFL_CUDA_STAGE_FRAGS=1 -' slim" \
  "DFL_BENCH_LAYER=qwen35-27b DFL_BENCH_TOKENS='1 8 16 24' KERNEL_VARIANTS='- DFL_CUDA_Q8P_MT4=1 DFL_CUDA_STAGE_FRAGS=1 DFL_CUDA_Q8P_MT4=1,DFL_CUDA_STAGE_FRAGS=1 DFL_CUDA_Q8P_SPLITK_LONG=6 DFL_CUDA_Q8P_SPLITK_LONG=8' kbench" \
  "SPEC_BATCHES=1 SPEC_VERIFY=16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='DFL_CUDA_SKIP_OPS=conv1d_silu DFL_CUDA_SKIP_OPS=gdn DFL_CUDA_SKIP_OPS=attention+attn_prep DFL_CUDA_SKIP_OPS=matmul+gdn+gdn_gates+conv1d_silu+gated_rmsnorm+sigmoid_mul+attention+attn_prep+add_rmsnorm+rmsnorm+swiglu' spec-bench" \
  "PP_VARIANTS='- DFL_CUDA_GDN_ACC=4' pp-profile"
