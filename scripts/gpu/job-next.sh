#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then "peer" goes first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-07 08:3x (~7 device minutes): the L2 prefetch lane (DFL_CUDA_PREFETCH_MB, opt-in: each plan prefetches
# the weight of the product after its idle stretch, the Qwen layer's out projection beside the delta rule or the
# attention, DeepSeek V4's wq_a|wkv and wq_b beside the HC site, wo_a beside the attention, the shared expert beside
# the FFN's HC site and routing). (1) The device replays with it (graphs capture the forked prefetches), the 27B tg b1
# alternated with 24 and 48 MB; (2) the 27B verify blocks alternated with 24 MB; (3) DeepSeek V4's 2-layer step, b1 / b8,
# with 16 and 32 MB.
cd "$(dirname "$0")/../.."
p=DFL_CUDA_PREFETCH_MB
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("LEAN_GROUPS=none TRY=$p=24 DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- $p=24 $p=48 - $p=24 $p=48' lean qwen3.5-27b:q8_0")
spec="SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$'"
steps+=("$spec SPEC_VARIANTS='- $p=24 - $p=24' spec-bench")
steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='- $p=32 $p=16 - $p=32 $p=16' ds4-decode-ab")
exec scripts/gpu/bg.sh start "${steps[@]}"
