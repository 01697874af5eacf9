#!/usr/bin/env bash
# The next job of docs/perf/cuda-notes.md (its latest "Next" section), as one bg.sh job: run on the GPU machine after
# scripts/gpu/pack.sh --peer (carry .gpu); poll with scripts/gpu/bg.sh wait 560.
cd "$(dirname "$0")/../.."
exec scripts/gpu/bg.sh start "DS4_LAYERS=3 DS4_FUSED_MODES=1 ds4-bench"
