#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). On an H200 where one is lent: the issues name it.
# Written 12-06 08:4x: a chain's conv in chunks of 8 tokens by default since (one H100 job, one run each: verify 8 /
# 16 / 23 rows -0.05 to -0.08 ms); against chunks of 16 (DFL_CUDA_CONV_CHUNK=16) alternating twice: the 27B decode,
# verify of 8 / 16 / 23 rows and the 23-node tree, then its prefill of 512 and 4096 tokens.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "SPEC_VARIANTS='- DFL_CUDA_CONV_CHUNK=16 - DFL_CUDA_CONV_CHUNK=16' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16,23 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench" \
  "VARIANTS='- DFL_CUDA_CONV_CHUNK=16' pp-variants"
