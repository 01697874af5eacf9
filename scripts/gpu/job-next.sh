#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then put "peer" first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-06 21:3x (~5 device minutes: the session had 8 left). DFL_CUDA_ATTN_G=1 (opt-in, written without a GPU):
# decode attention one query head a block instead of a KV head's group (qwen3-8b 8 -> 32 blocks at batch 1, the 27B
# 4 -> 24): lean on qwen3-8b q8_0 with it as TRY (the attention op tests, the device replays), then decode at batch 1,
# 8 and 32 with and without it, alternating (attention was 0.23 ms of qwen3-8b q8_0's 3.63 ms b1 step at 21:0x).
cd "$(dirname "$0")/../.."
peer=(); [ ! -f .gpu/llama-src.tar.xz ] || peer=(peer)  # same-job llama.cpp figures after quick
exec scripts/gpu/bg.sh start "${peer[@]}" \
  "TRY=DFL_CUDA_ATTN_G=1 LEAN_GROUPS=${LEAN_GROUPS:-attention} DFLASH_BENCH_BATCHES=${DFLASH_BENCH_BATCHES:-1,8,32} BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- DFL_CUDA_ATTN_G=1 - DFL_CUDA_ATTN_G=1' lean qwen3-8b:q8_0"
