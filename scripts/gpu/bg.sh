#!/usr/bin/env bash
# Several run.sh modes one after another in the background of the GPU machine, so that a job longer than one device
# call's 10 minutes runs on while later calls poll it. The job runs in a copy of the tree (.gpu/ included): a later
# call re-sends the working tree and may drop .gpu/ there, which must not pull it from under a running step.
#   scripts/gpu/bg.sh start 'NO_NCU=1 probe' 'skip-ops' 'spec'   each step "[VAR=value ...] mode [args]", quoted as in
#                                                                 a shell: "QUICK_VARIANTS='- A=1' quick"
#   scripts/gpu/bg.sh wait [SECONDS]                              until the job ends or SECONDS pass (default 540),
#                                                                 then its results as $OUT/bg.tgz and the summaries
set -uo pipefail
cd "$(dirname "$0")/../.."
job=/tmp/bg
case ${1:-} in
  start)
    shift
    [ -f .gpu/stage.tar.xz ] || { echo "missing .gpu/stage.tar.xz: run scripts/gpu/pack.sh and carry .gpu"; exit 1; }
    rm -rf "$job" /tmp/bgrepo && mkdir -p "$job" && cp -a . /tmp/bgrepo
    printf '%s\n' "$@" >"$job/steps"
    (cd /tmp/bgrepo && setsid nohup scripts/gpu/bg.sh _job >/dev/null 2>&1 </dev/null &)
    echo "started: $*" ;;
  _job)  # in /tmp/bgrepo
    i=0
    while IFS= read -r step; do
      i=$((i + 1)); eval "w=($step)"; envs=()  # (shell quoting: VAR='a b')
      while [ ${#w[@]} -gt 0 ] && [[ ${w[0]} == *=* ]]; do envs+=("${w[0]}"); w=("${w[@]:1}"); done
      echo "$(date -u +%T) step $i: $step" >>"$job/log"
      env "${envs[@]}" OUT="$job/$i" scripts/gpu/run.sh "${w[@]}" 2>&1 | sed "s|^|[$i] |" >>"$job/log"
      echo "$(date -u +%T) step $i done" >>"$job/log"
    done <"$job/steps"
    touch "$job/done" ;;
  wait)
    [ -d "$job" ] || { echo "no job here (the machine was fresh: start one)"; exit 1; }
    end=$((SECONDS + ${2:-540}))
    while [ ! -f "$job/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    [ -f "$job/done" ] && echo "job finished" || echo "job still running"
    OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
    tar -C "$job" -czf "$OUT/bg.tgz" . 2>/dev/null
    tail -n 60 "$job/log" ;;
  *) echo "usage: $0 start STEP... | wait [SECONDS]"; exit 2 ;;
esac
