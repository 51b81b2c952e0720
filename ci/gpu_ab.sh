#!/usr/bin/env bash
# One call on a GPU machine: the tree as it is and the same tree with patch series applied one
# after another (variant 0 = the tree, 1 = + the first series, 2 = + the second, ...), each built
# into its own folder and put through the same command, so kernel changes are compared on one
# card in one run. Results land in $OUT (default ./out): build-N.log and run-N.log per variant.
#   ci/gpu_ab.sh 'pytest tests/test_paged_decode_attention.py -m gpu -q -x' A.mbox B.mbox
#   ci/gpu_ab.sh 'python3 bench/paged_decode_attention.py --out $OUT/bench-$VARIANT.json' A.mbox
# The command runs in the variant's source folder with that variant's build first on PYTHONPATH;
# $VARIANT (0, 1, ...) and $OUT are set for it. Patches are `git format-patch` output, applied
# with `git apply` (which needs no repository) or `patch -p1` where git is missing.
# CUDA_ARCH_LIST defaults to 9.0a; wheels carried in .whl/ are unpacked first, as ci/gpu.sh does.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: ci/gpu_ab.sh 'COMMAND' [PATCHES.mbox ...]" >&2; exit 2; }
COMMAND=$1
shift
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export OUT
PY=${PYTHON:-python3}
unset PYTHONDONTWRITEBYTECODE  # cache bytecode, as ci/gpu.sh does (7-10 s per process that imports torch)
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/opforge-pycache}
ROOT=$(pwd)
WORK=${WORK:-/tmp/opforge-ab}
rm -rf "$WORK" && mkdir -p "$WORK"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl
fi
patches=()
for p in "$@"; do patches+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"); done

status=0
for variant in $(seq 0 ${#patches[@]}); do
  src="$WORK/src-$variant"
  # The tree without build outputs, then every series up to this variant.
  mkdir -p "$src" && tar -C "$ROOT" --exclude=./build --exclude=./out --exclude=./.git -cf - . | tar -C "$src" -xf -
  for ((i = 0; i < variant; i++)); do
    if ! (cd "$src" && if command -v git >/dev/null; then git apply --whitespace=nowarn "${patches[$i]}"
                         else patch -p1 -s <"${patches[$i]}"; fi); then
      echo "variant $variant: ${patches[$i]} does not apply" && status=1 && continue 2
    fi
  done
  start=$(date +%s)
  arch=${CUDA_ARCH_LIST:-9.0a}
  require=$([ "$arch" = none ] && echo 0 || echo 1)  # a GPU build must not fall back to CPU only
  if ! (cd "$src" && CUDA_ARCH_LIST=$arch OPFORGE_REQUIRE_CUDA=$require $PY -m pip install -v --no-build-isolation \
        --no-deps --target "$WORK/build-$variant" . >"$OUT/build-$variant.log" 2>&1); then
    echo "variant $variant: build failed (build-$variant.log)" && tail -20 "$OUT/build-$variant.log" && status=1 && continue
  fi
  echo "variant $variant: built in $(( $(date +%s) - start )) s"
  start=$(date +%s)
  (cd "$src" && VARIANT=$variant PYTHONPATH="$WORK/build-$variant:$WORK/site${PYTHONPATH:+:$PYTHONPATH}" \
     bash -c "$COMMAND" >"$OUT/run-$variant.log" 2>&1)
  rc=$?
  echo "variant $variant: command rc=$rc in $(( $(date +%s) - start )) s"
  tail -3 "$OUT/run-$variant.log"
  [ $rc -eq 0 ] || status=1
done
exit $status
