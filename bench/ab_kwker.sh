#!/usr/bin/env bash
# ab_kwker.sh - two kwker builds side by side (A B A B ..., fresh processes): kwker bench pp512 /
# tg128, one JSON line per run on stdout, medians and new/old ratios on stderr at the end.
#   bench/ab_kwker.sh OLD/kwker NEW/kwker [runs=5] > ab.jsonl
# Environment: AB_MODEL (default the bundled SmolLM2-135M-Instruct Q4_1), AB_PRECISIONS (default
# "int4 balanced preserve"), AB_ACT_BITS (16 or 8; preserve always runs 16), AB_N_GEN (128),
# AB_OLD_ARGS / AB_NEW_ARGS (more bench options for one side: one build against itself with
# another setting, e.g. AB_OLD_ARGS="--kv-bits 32"), AB_OLD_ENV / AB_NEW_ENV (NAME=value words for
# one side's environment, e.g. AB_NEW_ENV="KWKER_AMX_PRESERVE=on").
# Each side has its own pack cache (warmed by its first run).
set -euo pipefail
old=$1 new=$2 runs=${3:-5}
model=${AB_MODEL:-"$(dirname "$0")/../models/SmolLM2-135M-Instruct.Q4_1.gguf"}
precs=${AB_PRECISIONS:-"int4 balanced preserve"}
act=${AB_ACT_BITS:-16} ngen=${AB_N_GEN:-128}
cache=$(mktemp -d) out=$(mktemp)
trap 'rm -rf "$cache" "$out"' EXIT
for prec in $precs; do
  ab=$act; [ "$prec" = preserve ] && ab=16
  for ((r = 1; r <= runs; r++)); do
    for side in old new; do
      bin=$old extra=${AB_OLD_ARGS:-} xenv=${AB_OLD_ENV:-}
      [ "$side" = new ] && bin=$new extra=${AB_NEW_ARGS:-} xenv=${AB_NEW_ENV:-}
      # shellcheck disable=SC2086 # extra and xenv are lists of words
      json=$(env $xenv KWKER_CACHE="$cache/$side" "$bin" bench --model "$model" --precision "$prec" \
             --act-bits "$ab" -p 512 -n "$ngen" -r 1 -t 2 --json $extra 2>/dev/null)
      echo "{\"side\": \"$side\", \"run\": $r, \"r\": $json}" | tee -a "$out"
    done
  done
done
python3 - "$out" >&2 <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for prec in dict.fromkeys(r["r"]["precision_name"] for r in rows):
    med = {s: {k: st.median(r["r"][k] for r in rows
                            if r["side"] == s and r["r"]["precision_name"] == prec)
               for k in ("pp_tps", "tg_tps")} for s in ("old", "new")}
    print("%-9s pp %.1f -> %.1f (x%.3f)  tg %.2f -> %.2f (x%.3f)" % (
        prec, med["old"]["pp_tps"], med["new"]["pp_tps"], med["new"]["pp_tps"] / med["old"]["pp_tps"],
        med["old"]["tg_tps"], med["new"]["tg_tps"], med["new"]["tg_tps"] / med["old"]["tg_tps"]))
PY
