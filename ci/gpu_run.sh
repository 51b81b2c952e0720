#!/usr/bin/env bash
# On a GPU machine after ci/gpu.sh has installed opforge: benchmark the built-in dataset with
# `opforge run` and bring back the traces (tarred: $OUT keeps only shallow files), the console
# output and the HTML report.
#   RUN_ARGS     extra arguments of `opforge run` (e.g. --definitions rmsnorm_h4096)
#   RUN_TIMEOUT  seconds before the run is stopped (default 480); traces written so far are kept
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # wheels ci/gpu.sh unpacked
WORK=${WORK:-/tmp/opforge-run}
rm -rf "$WORK" && mkdir -p "$WORK"
start=$(date +%s)
(cd "$WORK" && COLUMNS=200 timeout ${RUN_TIMEOUT:-480} $PY -m opforge.cli run ${RUN_ARGS:-} >"$OUT/run.log" 2>&1)
echo "opforge run: rc=$? in $(( $(date +%s) - start )) s"
tail -5 "$OUT/run.log"
tar czf "$OUT/traces.tgz" -C "$WORK/opforge-runs/builtin" traces
(cd "$WORK" && $PY -m opforge.cli report html --dataset opforge-runs/builtin -o "$OUT/report.html" \
   >"$OUT/report.log" 2>&1; $PY -m opforge.cli report summary --dataset opforge-runs/builtin \
   >>"$OUT/report.log" 2>&1)
tail -30 "$OUT/report.log"
