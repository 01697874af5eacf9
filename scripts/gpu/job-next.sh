#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer for llama.cpp beside ds4-bench at the end); poll with scripts/gpu/bg.sh wait
# 420 back to back (the machine is let go after ~30 s idle). On an H200 where one is lent: the issues name it.
# Four opt-ins written without a GPU (cuda-notes rows 12-06 07:1x, 07:2x and 07:3x): DFL_CUDA_GDN_CHAIN=1 (the
# DeltaNet layer's kernels as chained launches), DFL_CUDA_GDN_PARALLEL=1 with its launches trimmed (nothing for a batch
# that records nothing, no staged launch where every entry is the parallel form's), DFL_CUDA_GDN_FUSED=1 (conv, gates
# and the parallel-form delta rule in one kernel where every entry records), DFL_CUDA_CONV_GATES=1 (conv and gates in
# one kernel for any batch: decode too). `check` with all four in its UNMEASURED pass (the gdn op tests'
# conv_gates_gdn cases are the two fused kernels'); the spec checks (greedy equality on the GPU) with them and with
# none (the demo pair's agreement counts side by side); the 27B decode and verify of 8 / 16 / 23 rows
# and the 23-node tree with each; Nsight Compute's time of each kernel of a 16-row verify with the staged and the fused
# gdn, then its sections (throughputs, occupancy, stall reasons) of the staged, parallel and fused kernels (gdn-ncu);
# last, DeepSeek V4 on 3 layers beside llama.cpp (its file takes minutes to make).
cd "$(dirname "$0")/../.."
all='DFL_CUDA_GDN_CHAIN=1,DFL_CUDA_CONV_GATES=1,DFL_CUDA_GDN_FUSED=1'
ncu='NO_CPU_PEER=1 STEP_BENCH=vf DFLASH_BENCH_VERIFY=16 NCU_SKIP=2000 NCU_COUNT=1500 step-ncu qwen3.5-27b:q8_0'
exec scripts/gpu/bg.sh start "peer" \
  "UNMEASURED='DFL_CUDA_GDN_PARALLEL=1 DFL_CUDA_GDN_CHAIN=1 DFL_CUDA_GDN_FUSED=1 DFL_CUDA_CONV_GATES=1' check" \
  "DFL_CUDA_GDN_CHAIN=1 DFL_CUDA_GDN_FUSED=1 DFL_CUDA_CONV_GATES=1 spec-checks" "spec-checks" \
  "SPEC_VARIANTS='- DFL_CUDA_GDN_CHAIN=1 DFL_CUDA_CONV_GATES=1 DFL_CUDA_GDN_PARALLEL=1 DFL_CUDA_GDN_FUSED=1 $all -' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "$ncu" "DFL_CUDA_GDN_FUSED=1 $ncu" "gdn-ncu" \
  "DS4_LAYERS=3 DS4_FUSED_MODES=1 ds4-bench"
