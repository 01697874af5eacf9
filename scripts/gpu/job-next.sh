#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). On an H200 where one is lent: the issues name it.
# Written 12-06 08:3x: the parallel-form gdn now the default for batches of token trees (DFL_CUDA_GDN_PARALLEL=0 the
# staged kernel, =1 chains too), and DFL_CUDA_GDN_LANES=8 (opt-in): the staged kernel with eight lanes a column, twice
# the blocks; DFL_CUDA_CONV_CHUNK=8 (opt-in): a chain's conv in chunks of 8 tokens, twice the blocks of a 16-row
# verify. The gdn op tests with each; the spec checks (greedy equality on the GPU) with the defaults and with the two
# opt-ins; the 27B decode and verify of 8 / 16 / 23 rows and the 23-node tree with each (the defaults first and last);
# the 27B prefill of 512 and 4096 tokens with each (the staged kernel runs every prefill's recurrence).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "OPS_VARIANTS='DFL_CUDA_GDN_LANES=8 DFL_CUDA_CONV_CHUNK=8 DFL_CUDA_GDN_PARALLEL=1 DFL_CUDA_GDN_PARALLEL=0' ops gdn" \
  "spec-checks" "DFL_CUDA_GDN_LANES=8 DFL_CUDA_CONV_CHUNK=8 spec-checks" \
  "SPEC_VARIANTS='- DFL_CUDA_GDN_LANES=8 DFL_CUDA_CONV_CHUNK=8 DFL_CUDA_GDN_PARALLEL=0 -' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "VARIANTS='- DFL_CUDA_GDN_LANES=8' pp-variants"
