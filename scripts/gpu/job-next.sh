#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then "peer" goes first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-07 02:xx (~6 device minutes, ~8 with NCU=1): the DeltaNet conv in its input projection's product at one token
# (DFL_CUDA_CONV_FOLD=1, opt-in, unmeasured: the 27B's b1 step left 0.141 ms to the conv launch at 01:3x). (1) lean on
# the 27B: the gdn op tests with it (the fold against the ops apart, bit for bit), the replays, then tg b1 alternated
# twice against the defaults and DFL_CUDA_Q8P_ROWS1_R=1 (opt-in: one-token products of wide q8_0 matrices a row a
# warp, a smaller last wave); (2) qwen3-8b q8_0 tg b1 with ROWS1_R=1 against the defaults, alternated twice; NCU=1:
# (3) ncu of the one-token q4_K and q8_0 GEMVs (issue 10's furthest line, q4_K b1: why the one-token q4_K GEMV runs at
# ~1.7 TB/s). LEAN=1 (~3 minutes): step (1) without op tests or ROWS1_R=1, nothing else.
cd "$(dirname "$0")/../.."
groups=gdn; [ -z "${LEAN:-}" ] || groups=none
fold="LEAN_GROUPS=$groups TRY=DFL_CUDA_CONV_FOLD=1 DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg'"
rows1=" DFL_CUDA_Q8P_ROWS1_R=1"; [ -z "${LEAN:-}" ] || rows1=
fold+=" QUICK_VARIANTS='- DFL_CUDA_CONV_FOLD=1$rows1 - DFL_CUDA_CONV_FOLD=1$rows1'"
fold+=" lean qwen3.5-27b:q8_0"
steps=("$fold")
[ -n "${LEAN:-}" ] || steps+=("DFLASH_BENCH_BATCHES=1 VARIANTS='- DFL_CUDA_Q8P_ROWS1_R=1 - DFL_CUDA_Q8P_ROWS1_R=1' tg-variants qwen3-8b:q8_0")
[ -z "${NCU:-}" ] || steps+=("NCU_CASES='q4_K:1 q8_0:1' NCU_TIMEOUT=150 ncu")
exec scripts/gpu/bg.sh start "${steps[@]}"
