#!/usr/bin/env bash
# One call on a GPU machine: build the wheel for its arch, run the whole test suite (GPU tests
# included), the self-check and the roofline benchmark. Results land in $OUT (default ./out):
#   build.log, tests.log, selfcheck.log, bench.log, results.json, results.md
# TESTS (default: tests) narrows the test run; SKIP_BENCH=1 leaves out the roofline benchmark.
# Carried wheels in .whl/ (e.g. Liger-Kernel for the peer columns) are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The GPU machine's Python is set not to write bytecode (PYTHONDONTWRITEBYTECODE=1), so every
# process compiled torch's sources again: importing torch and Inductor took 11.7-15.4 s there,
# 4.4-5.2 s once their bytecode was cached, and the suite starts hundreds of processes (test
# workers, the runner's device workers, command-line runs). Cache it outside the installation.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/opforge-pycache}
# Builds record OPFORGE_COMMIT when it is set: set it to the commit under test (the copy of the
# tree on a GPU machine may carry stale git metadata).
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi

start=$(date +%s)
if ! CUDA_ARCH_LIST=${CUDA_ARCH_LIST:-9.0a} OPFORGE_REQUIRE_CUDA=1 $PY -m pip install -v --no-build-isolation . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s; $(grep -o 'Created wheel.*size=[0-9]*' "$OUT/build.log")"

$PY -m opforge >"$OUT/selfcheck.log" 2>&1; echo "self-check: $(tail -1 "$OUT/selfcheck.log")"
$PY -m pytest ${TESTS:-tests} -q -p no:cacheprovider -x ${PYTEST_ARGS:-} >"$OUT/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/tests.log")"
grep -E "FAILED|Error" "$OUT/tests.log" | head -20
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  $PY bench/roofline.py --out "$OUT/results.json" --markdown "$OUT/results.md" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60
fi
