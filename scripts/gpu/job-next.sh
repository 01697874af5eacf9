#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then put "peer" first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-06 22:1x (~10 device minutes), two opt-ins written without a GPU: DFL_CUDA_ATTN_G=1 (decode attention one
# query head a block: qwen3-8b 8 -> 32 blocks at batch 1, the 27B 4 -> 24) and DFL_CUDA_RESID_NORM_T=1 (the residual-
# norm fold across 8..32 tokens on the staged q8_0 kernel). (1) quick on qwen3-8b q8_0 with both as TRY (op tests: the
# attention grid and the fold cases at 8, 16 and 32 tokens; replays, TestDeviceFoldMatchesCPU's 16-token blocks
# among them; speculative greedy), then decode at batch 1, 8 and 32 with each, alternating (attention was 0.23 ms of
# the 3.63 ms b1 step at 21:0x; b8's 72 norms ~0.3 ms of ~4.0). (2) The 27B verify blocks with and without the fold
# across tokens (issue 11's 16 rows, 1.22x at 21:0x).
# LEAN=1 (a call's last minutes): step (1) as run.sh lean without op tests, no step (2). LEAN=2 (~8 minutes): (1) as
# lean with its op tests at batch 1 and 8, (2) with one run each.
cd "$(dirname "$0")/../.."
peer=(); [ ! -f .gpu/llama-src.tar.xz ] || peer=(peer)  # same-job llama.cpp figures after quick
try=DFL_CUDA_ATTN_G=1,DFL_CUDA_RESID_NORM_T=1
variants="- DFL_CUDA_ATTN_G=1 DFL_CUDA_RESID_NORM_T=1 - DFL_CUDA_ATTN_G=1 DFL_CUDA_RESID_NORM_T=1"
spec="SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$'"
if [ "${LEAN:-}" = 2 ]; then  # ~8 minutes: (1) as lean with the matmul and attention op tests, b1 / b8; (2) once each
  exec scripts/gpu/bg.sh start \
    "TRY=$try DFLASH_BENCH_BATCHES=1,8 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$variants' lean qwen3-8b:q8_0" \
    "$spec SPEC_VARIANTS='- DFL_CUDA_RESID_NORM_T=1' spec-bench"
fi
if [ -n "${LEAN:-}" ]; then
  exec scripts/gpu/bg.sh start \
    "TRY=$try LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1,8 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$variants' lean qwen3-8b:q8_0"
fi
exec scripts/gpu/bg.sh start "${peer[@]}" \
  "TRY=$try DFLASH_BENCH_BATCHES=1,8,32 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$variants' quick qwen3-8b:q8_0" \
  "$spec SPEC_VARIANTS='- DFL_CUDA_RESID_NORM_T=1 - DFL_CUDA_RESID_NORM_T=1' spec-bench"
