#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures; the H200 is
# the card issues 10, 11 and 13 name); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-07 17:3x, updated 19:4x (~10 device minutes and the start on an H100; SHORT=1: the variants alone, ~6;
# V4_ONLY=1 leaves out the H200's steps, ~8 minutes more). A 4-layer V4-Flash file (its fourth layer routed, its
# attention over the indexer's 512 selection slots), every variant unmeasured: float-weight products of 2..8 tokens on
# tensor cores (DFL_CUDA_GEMV16_MMA=1 for f16 / bf16, DFL_CUDA_GEMV32_MMA=1 for f32), 16-bit products four rows a warp
# (DFL_CUDA_GEMV16_ROWS=4), the attention skipping tiles of padded selection slots (DFL_CUDA_DS4_ATTN_SKIP=1), a
# batch's attention four heads a block (DFL_CUDA_DS4_ATTN_HEADS=4): op tests, replay, goldens, decode b1 / b8 / b32
# alternated twice (the defaults now include the row-block kernel for up to 8 tokens); then a 10-layer file beside
# llama.cpp; on an H200 the 27B's decode and verify.
cd "$(dirname "$0")/../.."
steps=()
h200=
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && h200=1
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("TRY='DFL_CUDA_GEMV16_MMA=1 DFL_CUDA_GEMV32_MMA=1 DFL_CUDA_GEMV16_ROWS=4 DFL_CUDA_DS4_ATTN_SKIP=1 DFL_CUDA_DS4_ATTN_HEADS=4' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
# SHORT=1 (a device budget of ~7 minutes): the variants alone
[ -z "${SHORT:-}" ] || exec scripts/gpu/bg.sh start "${steps[@]}"
# issue 13 asks for as many layers as fit: a 10-layer file (~38 GB: the disk is 64 GB), ours at b1 / b8 and, with PEER=1,
# llama.cpp on it
steps+=("DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS=- ds4-decode-ab")
[ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=10 ds4-peer")
# on an H200 (issues 10, 11 and 13 name it) the 27B's decode (llama.cpp beside it with PEER=1) and its verify blocks
# (~5 device minutes more)
if [ -n "$h200" ] && [ -z "${V4_ONLY:-}" ]; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
exec scripts/gpu/bg.sh start "${steps[@]}"
