#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-06 13:4x: DFL_CUDA_GEMV_AHEAD=8 / 4 (gemv_q8p_ahead_kernel: one-token products on the rows kernel stage
# 8 / 4 words a lane of each row in shared memory before their wait): qwen3-8b q8_0 decode at batch 1 against the
# defaults, alternating (its q|k|v, gate|up and head take it), then the matmul op tests with each (the new one-token
# wide shapes among them). If it wins there, the 27B's decode (every one of its one-token products is on the rows
# kernel) and verify next: SPEC_VARIANTS='- DFL_CUDA_GEMV_AHEAD=8 - DFL_CUDA_GEMV_AHEAD=8' spec-bench.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "DFLASH_BENCH_BATCHES=1 SKIP_VARIANTS='- DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_GEMV_AHEAD=4 - DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_GEMV_AHEAD=4' skip-ops qwen3-8b:q8_0" \
  "OPS_VARIANTS='DFL_CUDA_GEMV_AHEAD=8 DFL_CUDA_GEMV_AHEAD=4' ops matmul"
