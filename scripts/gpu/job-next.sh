#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then "peer" goes first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-07 06:1x (~5 device minutes on an H200): the two folds left opt-in after the 06:0x job, apart, where that
# job ran all four together and the verify of 16 rows lost 0.4 ms with them. (1) lean on the 27B: the gdn and
# attention op tests with DFL_CUDA_GDN_NORM_FOLD=1 and DFL_CUDA_GATE_FOLD=1 (and the new defaults: the conv fold,
# eight warps of the parallel-form gdn), the device replays with them, then tg b1 alternated: defaults, the gdn norm
# fold, the gate fold, both; (2) the 27B verify blocks (8, 16, tree of 23) with each, and with the verify's chains in
# the parallel form too (DFL_CUDA_GDN_PARALLEL=1: even with four warps a block at 12-06 08:0x, the tree's form gained
# 0.12-0.2 ms from eight at 06:0x).
cd "$(dirname "$0")/../.."
try=DFL_CUDA_GDN_NORM_FOLD=1,DFL_CUDA_GATE_FOLD=1
v27="- DFL_CUDA_GDN_NORM_FOLD=1 DFL_CUDA_GATE_FOLD=1 $try -" groups="gdn attention"
# LEAN=1 (~4 minutes on an H200): no op tests, tg b1 once each
[ -z "${LEAN:-}" ] || { v27="- DFL_CUDA_GDN_NORM_FOLD=1 DFL_CUDA_GATE_FOLD=1"; groups=none; }
steps=("LEAN_GROUPS='$groups' TRY=$try DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$v27' lean qwen3.5-27b:q8_0")
spec="SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$'"
steps+=("$spec SPEC_VARIANTS='- DFL_CUDA_GDN_NORM_FOLD=1 DFL_CUDA_GATE_FOLD=1 DFL_CUDA_GDN_PARALLEL=1 -' spec-bench")
exec scripts/gpu/bg.sh start "${steps[@]}"
