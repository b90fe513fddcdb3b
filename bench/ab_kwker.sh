#!/usr/bin/env bash
# ab_kwker.sh - two kwker builds side by side (A B A B ..., fresh processes): kwker bench pp512 /
# tg128 on the bundled SmolLM2-135M for int4, balanced and preserve, one JSON line per run.
#   bench/ab_kwker.sh OLD/kwker NEW/kwker [runs=5] > ab.jsonl
# Each side has its own pack cache (warmed by its first run). Medians: see docs/benchmarks.md.
set -euo pipefail
old=$1 new=$2 runs=${3:-5}
model="$(dirname "$0")/../models/SmolLM2-135M-Instruct.Q4_1.gguf"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
for prec in int4 balanced preserve; do
  for ((r = 1; r <= runs; r++)); do
    for side in old new; do
      bin=$old; [ "$side" = new ] && bin=$new
      json=$(KWKER_CACHE="$cache/$side" "$bin" bench --model "$model" --precision "$prec" \
             -p 512 -n 128 -r 1 -t 2 --json 2>/dev/null)
      echo "{\"side\": \"$side\", \"run\": $r, \"r\": $json}"
    done
  done
done
