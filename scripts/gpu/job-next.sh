#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 13:5x (no device time left that session to run any of it):
# - DFL_CUDA_GEMV_AHEAD=8 / 4 (gemv_q8p_ahead_kernel: one-token products on the rows kernel stage 8 / 4 words a lane
#   of each row in shared memory before their wait): qwen3-8b q8_0 decode at batch 1 against the defaults,
#   alternating (its q|k|v, gate|up and head take it), then the matmul op tests with each (the one-token wide shapes
#   added for it among them), then the 27B's decode and verify (every one of its one-token products takes it).
#   DFL_CUDA_GEMV_AHEAD_R1=1 (14:3x) adds the 8B's o and down (one row a warp) to it.
# - DFL_CUDA_PDL_EARLY=3 (only grids of more than three waves trigger early: the 8B's gate|up, 768 tiles, no longer;
#   the 27B's 16-token gate|up, 1,088, still): qwen3-8b tg b8 / b32 (q8_0 b32 and q4_K b8 lost 0.03-0.06 ms to the
#   early trigger at 13:2x) and the 27B verify.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "DFLASH_BENCH_BATCHES=1 SKIP_VARIANTS='- DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_GEMV_AHEAD=8,DFL_CUDA_GEMV_AHEAD_R1=1 DFL_CUDA_GEMV_AHEAD=4 - DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_GEMV_AHEAD=8,DFL_CUDA_GEMV_AHEAD_R1=1 DFL_CUDA_GEMV_AHEAD=4' skip-ops qwen3-8b:q8_0" \
  "OPS_VARIANTS='DFL_CUDA_GEMV_AHEAD=8,DFL_CUDA_GEMV_AHEAD_R1=1 DFL_CUDA_GEMV_AHEAD=4,DFL_CUDA_GEMV_AHEAD_R1=1' ops matmul" \
  "SKIP_VARIANTS='- DFL_CUDA_PDL_EARLY=3 - DFL_CUDA_PDL_EARLY=3' skip-ops qwen3-8b:q8_0 qwen3-8b:q4_K" \
  "SPEC_VARIANTS='- DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_PDL_EARLY=3 - DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_PDL_EARLY=3' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench"
