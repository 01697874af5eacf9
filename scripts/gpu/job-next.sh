#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 10:0x (~8 device minutes; ~10 with the peer). (1) The 27B tg b1 with the defaults (llama.cpp with
# PEER=1) and its verify blocks (issues 10 and 11; on an H200 if one is lent); (2) a 4-layer V4-Flash file (the fourth
# layer routed by the arg-max rounds, not hashed; compressed layers among them): replay and goldens, decode with and
# without the late Sinkhorn (DFL_CUDA_HC_SITE_LATE=0), then each kernel of its one-token step alone (ncu): where the
# routed layers' chain differs from the 2-layer file's before the next kernel work on issue 13.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
steps+=("TRY=DFL_CUDA_HC_SITE_LATE=0 DS4_LAYERS=4 NO_PROFILE=1 ds4-try")
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 NCU_SKIP=400 NCU_COUNT=900 step-ncu ds4-L4:q8_0")
exec scripts/gpu/bg.sh start "${steps[@]}"
