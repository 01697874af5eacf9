#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 13:3x (~8 device minutes). A 4-layer V4-Flash file (its fourth layer routed): the grouped wo_a of a
# batched step in one group launch of the rows kernel (DFL_CUDA_GROUPED_ROWS=1, where 8 tokens ran a gather, a
# quantizer, an 8-token product and a scatter a group: ~32 launches a layer) against the defaults: op tests, replay,
# goldens, decode alternated; then each kernel of a batch-8 step alone (where b8's ~0.8 ms a layer goes), then b1 / b8
# with single ops left out (skip-ops). On an H200 the 27B's figures first.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
# on an H200 (issues 10 and 11 name it; none lent since 12-07 06:0x) first the 27B's decode (llama.cpp beside it with
# PEER=1) and its verify blocks (~5 device minutes more)
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; then
  steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
  steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
fi
steps+=("TRY='DFL_CUDA_GROUPED_ROWS=1' DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=2 ds4-try")
steps+=("NO_CPU_PEER=1 DFLASH_BENCH_CONTEXT=1 STEP_BATCHES=8 NCU_SKIP=1500 NCU_COUNT=1500 NCU_STEP_LIST=90 step-ncu ds4-L4:q8_0")
steps+=("DS4_LAYERS=4 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='- DFL_CUDA_SKIP_OPS=moe_experts DFL_CUDA_SKIP_OPS=matmul DFL_CUDA_SKIP_OPS=ds4_attention DFL_CUDA_SKIP_OPS=hc_site+hc_post+hc_comb' ds4-decode-ab")
exec scripts/gpu/bg.sh start "${steps[@]}"
