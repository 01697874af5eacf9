#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then "peer" goes first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-07 03:xx-05:xx (~11 device minutes, ~12 with NCU=1; LEAN=1 ~4, ~7 on an H200), none of it run yet (the 12-07
# sessions' device time went to refused starts): four folds of small launches into the kernels before them and a grid
# knob, all opt-in. (1) lean on the 27B: the gdn and attention op tests with DFL_CUDA_CONV_FOLD=1, DFL_CUDA_PREP_FOLD=1,
# DFL_CUDA_GATE_FOLD=1 and DFL_CUDA_GDN_NORM_FOLD=1 (each fold against the ops apart, bit for bit), the device replays
# with them (TestDeviceFoldMatchesCPU: 4096-wide qwen3 and qwen35 on the folded paths), then tg b1 alternated twice:
# defaults, all four folds, the conv fold, the gdn norm fold, and DFL_CUDA_Q8P_ROWS1_R=1 once (one-token products of
# wide q8_0 matrices a row a warp, a smaller last wave); the op tests and replays also with DFL_CUDA_GDN_PAR_WARPS=8
# (written 12-07 05:3x: the trees' parallel-form gdn on eight warps a block); (2) the 27B verify blocks with the folds
# and with PAR_WARPS=8 (~3 minutes; on an H200 even with LEAN=1); (3) qwen3-8b q8_0 tg b1: the prep fold and ROWS1_R=1
# against the defaults; NCU=1: (4) ncu of the one-token q4_K and q8_0 GEMVs (issue 10's furthest line).
# LEAN=1 (~4 minutes): step (1) without op tests: defaults, all four folds, the conv fold, defaults.
cd "$(dirname "$0")/../.."
groups="gdn attention"; [ -z "${LEAN:-}" ] || groups=none
folds=DFL_CUDA_CONV_FOLD=1,DFL_CUDA_PREP_FOLD=1,DFL_CUDA_GATE_FOLD=1,DFL_CUDA_GDN_NORM_FOLD=1
try=$folds,DFL_CUDA_GDN_PAR_WARPS=8
v27="- $folds DFL_CUDA_CONV_FOLD=1 DFL_CUDA_GDN_NORM_FOLD=1 DFL_CUDA_Q8P_ROWS1_R=1 - $folds"
[ -z "${LEAN:-}" ] || v27="- $folds DFL_CUDA_CONV_FOLD=1 -"
steps=("LEAN_GROUPS='$groups' TRY=$try DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$v27' lean qwen3.5-27b:q8_0")
# The 27B verify blocks (issue 11): the folds (the gdn norm fold reaches the verify's chains) and eight warps a block
# of the trees' parallel-form gdn, against the defaults; on an H200 (which the issue names; its figures are from 12-06
# 08:1x) even with LEAN=1.
spec="SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$'"
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 || [ -z "${LEAN:-}" ]; then
  steps+=("$spec SPEC_VARIANTS='- $folds DFL_CUDA_GDN_PAR_WARPS=8 -' spec-bench")
fi
if [ -z "${LEAN:-}" ]; then
  steps+=("DFLASH_BENCH_BATCHES=1 VARIANTS='- DFL_CUDA_PREP_FOLD=1 DFL_CUDA_Q8P_ROWS1_R=1 - DFL_CUDA_PREP_FOLD=1' tg-variants qwen3-8b:q8_0")
fi
[ -z "${NCU:-}" ] || steps+=("NCU_CASES='q4_K:1 q8_0:1' NCU_TIMEOUT=150 ncu")
exec scripts/gpu/bg.sh start "${steps[@]}"
