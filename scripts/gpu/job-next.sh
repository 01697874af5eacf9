#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures; the H200 is
# the card issues 10, 11 and 13 name); poll with scripts/gpu/bg.sh wait 400 back to back (the machine is let go after
# ~30 s idle). Say which card gave each figure.
# Written 12-07 21:4x (~6 device minutes on an H100; SHORT=1: the 4-layer check alone, ~4; V4_ONLY=1 leaves out the
# H200's steps, ~5 minutes more). The new defaults of 21:4x (16-bit products of 2..8 tokens on tensor cores, the
# attention skipping tiles of padded selection slots) against the old ($old): the op tests, replay and goldens with
# both, then a 4-layer V4-Flash file's decode b1 / b8 / b32 alternated twice, a 10-layer file's b1 / b8 with both
# (llama.cpp beside it with PEER=1) and with its products or experts left out; on an H200 the 27B's decode and verify.
cd "$(dirname "$0")/../.."
steps=()
h200=
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && h200=1
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
old=DFL_CUDA_GEMV16_MMA=0,DFL_CUDA_DS4_ATTN_SKIP=0
# CHECKED=1: without the 4-layer check (run on an H100 at 21:3x), for a short call on an H200
[ -n "${CHECKED:-}" ] || steps+=("TRY=$old DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 DS4_BATCHES=1,8,32 ds4-try")
# SHORT=1 (a device budget of ~5 minutes): the 4-layer check alone
[ -z "${SHORT:-}" ] || exec scripts/gpu/bg.sh start "${steps[@]}"
# issue 13 asks for as many layers as fit: a 10-layer file (~38 GB: the disk is 64 GB), ours at b1 / b8 and, with PEER=1,
# llama.cpp on it
steps+=("DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='- $old' ds4-decode-ab")
[ -z "${PEER:-}" ] || steps+=("DS4_LAYERS=10 ds4-peer")
# where the 10-layer step's time goes: its products, its routed experts, both left out of the replayed graph (garbage
# out, time by difference; cuda-notes Next 21:4x)
steps+=("DS4_LAYERS=10 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='- DFL_CUDA_SKIP_OPS=matmul+matmul_grouped DFL_CUDA_SKIP_OPS=moe_experts DFL_CUDA_SKIP_OPS=matmul+matmul_grouped+moe_experts' ds4-decode-ab")
# on an H200 (issues 10, 11 and 13 name it) the 27B's decode (llama.cpp beside it with PEER=1) and its verify blocks
# (~5 device minutes more)
if [ -n "$h200" ] && [ -z "${V4_ONLY:-}" ]; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
exec scripts/gpu/bg.sh start "${steps[@]}"
