#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then "peer" goes first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-07 07:2x (~7 device minutes on an H200; LEAN=1 ~3: step 2 alone).
# (1) The new defaults' op tests: the gdn and attention groups (the conv fold's case never ran: the 06:0x op tests died
# in it on a fault of the test's own, fixed since; eight warps of the parallel-form gdn), the device replays, and the
# 27B tg b1 with and without the conv fold. (2) The 27B verify blocks (8, 16, tree of 23) with the verify's chains in
# the eight-warp parallel form (DFL_CUDA_GDN_PARALLEL=1: even with four warps at 12-06 08:0x; with eight the 16-row
# verify 13.89 -> 13.80 ms in one H100 run at 07:1x), alternated twice. (3) Where DeepSeek V4's batch-1 step goes inside
# a replayed graph (issue 13, ~37 % of the bound): the 2-layer V4-Flash file (hash-routed layers only, no compressor:
# every skip below leaves indices in range), decode b1 / b8 with each group of ops left out (DFL_CUDA_SKIP_OPS; not
# moe_route, whose ids the routed experts read: they cannot be left out). (4) The V4-Flash layer's plain products
# (wq_a|wkv, wq_b, wo_b, the shared expert's) at 1 and 8 tokens in the kernel bench (DFL_BENCH_LAYER=deepseek4-flash).
cd "$(dirname "$0")/../.."
v27="- DFL_CUDA_CONV_FOLD=0 - DFL_CUDA_CONV_FOLD=0"
steps=()
# with the peer packed (pack.sh --peer) llama.cpp builds meanwhile and step 1 ends with its figures on the same 27B file
[ ! -f .gpu/llama-src.tar.xz ] || steps+=(peer)
[ -n "${LEAN:-}" ] || steps+=("LEAN_GROUPS='gdn attention' DFLASH_BENCH_BATCHES=1 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$v27' lean qwen3.5-27b:q8_0")
spec="SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$'"
steps+=("$spec SPEC_VARIANTS='- DFL_CUDA_GDN_PARALLEL=1 - DFL_CUDA_GDN_PARALLEL=1' spec-bench")
skip="DFL_CUDA_SKIP_OPS"
ds4v="- $skip=matmul $skip=hc_pre_norm+hc_post $skip=ds4_attention+matmul_grouped $skip=norm_rope_tail+rmsnorm"
ds4v+=" $skip=swiglu_clamp $skip=embed+gather_rows+hc_head -"
[ -n "${LEAN:-}" ] || steps+=("DS4_LAYERS=2 NO_PROFILE=1 DS4_AB_RUNS=1 DS4_VARIANTS='$ds4v' ds4-decode-ab")
# (4) the V4-Flash layer's plain products at 1 and 8 tokens in the kernel bench (kbench-*.txt: each product's rate)
[ -n "${LEAN:-}" ] || steps+=("DFL_BENCH_LAYER=deepseek4-flash DFL_BENCH_TOKENS='1 8' KERNEL_VARIANTS=- kbench")
exec scripts/gpu/bg.sh start "${steps[@]}"
