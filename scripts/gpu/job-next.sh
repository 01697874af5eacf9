#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh (carry .gpu; --peer on an H200, then "peer" goes first for same-job llama.cpp figures); poll with
# scripts/gpu/bg.sh wait 420 back to back (the machine is let go after ~30 s idle). Say which card gave each figure.
# Written 12-07 00:4x (~12 device minutes): decode attention's heads a block by the grid (a9320ad: one query head a
# block where the grid neither splits nor fills the SMs) against DFL_CUDA_ATTN_G=8 (the grids before it). (1) quick
# on qwen3-8b q8_0 (op tests, replays, speculative greedy with the defaults and with DFL_CUDA_ATTN_G_SPLIT=1), then
# tg b1 / b8 / b32 both ways, alternating (b32 unmeasured with the rule: its grid fills the SMs, so it should not
# move); (2) the 27B's decode and verify blocks both ways (both take fewer heads a block now, unmeasured); (3) the
# 27B's b1 step op by op left out (skip-ops: the DeltaNet's small ops, attention, the norms); (4) qwen3-8b b1 / b8
# after a 1,024-token prompt (attention splits there): the defaults (full G, as before the rule),
# DFL_CUDA_ATTN_G_SPLIT=1 (opt-in, unmeasured: fewer heads a block where a split grid still leaves SMs idle; b8's
# grid fills them either way) and DFL_CUDA_ATTN_G=8 (should equal the defaults).
# LEAN=1 (a call's last minutes): step (1) as run.sh lean without op tests, b1 / b8, nothing else. LEAN=2 (~8
# minutes): (1) as lean with the attention op tests at b1 / b8, (2) with one run each.
cd "$(dirname "$0")/../.."
peer=(); [ ! -f .gpu/llama-src.tar.xz ] || peer=(peer)  # same-job llama.cpp figures after quick
variants="- DFL_CUDA_ATTN_G=8 - DFL_CUDA_ATTN_G=8"
spec="SPEC_BATCHES=1 SPEC_VERIFY=8,16 SPEC_TREE=23 SPEC_PROFILE=0 SPEC_BENCH='^BenchmarkGGUF\$'"
skip="DFLASH_BENCH_BATCHES=1 SKIP_VARIANTS='- DFL_CUDA_SKIP_OPS=gdn DFL_CUDA_SKIP_OPS=conv1d_silu DFL_CUDA_SKIP_OPS=gdn_gates"
skip+=" DFL_CUDA_SKIP_OPS=gated_rmsnorm DFL_CUDA_SKIP_OPS=sigmoid_mul DFL_CUDA_SKIP_OPS=attention+attn_prep"
skip+=" DFL_CUDA_SKIP_OPS=add_rmsnorm+rmsnorm DFL_CUDA_SKIP_OPS=matmul -' skip-ops qwen3.5-27b:q8_0"
long="- DFL_CUDA_ATTN_G_SPLIT=1 DFL_CUDA_ATTN_G=8 - DFL_CUDA_ATTN_G_SPLIT=1 DFL_CUDA_ATTN_G=8"
if [ -n "${LEAN:-}" ]; then
  groups=none steps=()
  if [ "$LEAN" = 2 ]; then groups=attention steps=("$spec SPEC_VARIANTS='- DFL_CUDA_ATTN_G=8' spec-bench"); fi
  exec scripts/gpu/bg.sh start \
    "LEAN_GROUPS=$groups DFLASH_BENCH_BATCHES=1,8 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$variants' lean qwen3-8b:q8_0" \
    "${steps[@]}"
fi
exec scripts/gpu/bg.sh start "${peer[@]}" \
  "TRY=DFL_CUDA_ATTN_G_SPLIT=1 DFLASH_BENCH_BATCHES=1,8,32 BENCH_FILTER='GGUF/tg' QUICK_VARIANTS='$variants' quick qwen3-8b:q8_0" \
  "$spec SPEC_VARIANTS='$variants' spec-bench" \
  "$skip" \
  "DFLASH_BENCH_CONTEXT=1024 DFLASH_BENCH_BATCHES=1,8 VARIANTS='$long' tg-variants qwen3-8b:q8_0"
