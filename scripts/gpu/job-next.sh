#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after
# ~30 s idle). Issue 11's line is set on the H200: ask for one (kind nvidia-h200) and say which card gave each figure.
# Written 12-06 11:5x: DFL_CUDA_PDL_EARLY=1 for the staged and streamed products of more than one wave only (every
# product early lost on qwen3-8b, 11:4x): qwen3-8b q8_0 tg b1 / b8 / b32 and the 27B verify (8 / 16 / 23 rows, the
# tree) with and without it, alternating. Its op tests and the device and speculative tests passed at 11:4x with every
# product early (a superset of the triggers here).
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start \
  "SKIP_VARIANTS='- DFL_CUDA_PDL_EARLY=1 - DFL_CUDA_PDL_EARLY=1' skip-ops qwen3-8b:q8_0" \
  "SPEC_VARIANTS='- DFL_CUDA_PDL_EARLY=1 - DFL_CUDA_PDL_EARLY=1' SPEC_PROFILE=0 SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_BENCH='^BenchmarkGGUF\$' spec-bench"
