#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; with --peer, PEER=1 puts "peer" first for same-job llama.cpp figures: on an H200,
# the card issues 10 and 11 name); poll with scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s
# idle). Say which card gave each figure.
# Written 12-07 08:3x (~7 device minutes; ~9 with the peer). (1) The 27B tg b1 with the defaults (and llama.cpp on the
# same file with PEER=1: issue 10's same-job ratio); (2) the 27B verify blocks (8, 16, tree of 23; issue 11's ratios,
# the chains in parallel form by default since 2a1ec70); (3) where DeepSeek V4's batch-1 step goes inside a replayed
# graph, each op alone (08:0x left out groups: the dense products 0.288 ms of a 2-layer step's 0.664, the attention
# with the grouped product 0.089, the norms 0.052; hc_post and swiglu_clamp ~0 at b1): hc_pre, the routed experts
# (moe_experts, new), the quantizers (quantize_x, mma_acts), the attention and the grouped product apart, rmsnorm and
# norm_rope_tail apart.
cd "$(dirname "$0")/../.."
steps=()
[ ! -f .gpu/llama-src.tar.xz ] || [ -z "${PEER:-}" ] || steps+=(peer)
steps+=("LEAN_GROUPS=none DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='- -' lean qwen3.5-27b:q8_0")
steps+=("SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$' SPEC_VARIANTS='- -' spec-bench")
skip="DFL_CUDA_SKIP_OPS"
ds4v="- $skip=hc_pre $skip=moe_experts $skip=quantize_x $skip=mma_acts $skip=ds4_attention $skip=matmul_grouped"
ds4v+=" $skip=rmsnorm $skip=norm_rope_tail $skip=hc_pre+moe_experts -"
steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='$ds4v' ds4-decode-ab")
exec scripts/gpu/bg.sh start "${steps[@]}"
