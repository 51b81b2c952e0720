#!/usr/bin/env bash
# The CPU check that CI runs (via .ci/run) on a fresh clone: install, build with CUDA for one
# arch (so every .cu file compiles), confirm the build, compile the device code for the other
# archs that matter (8.0, 10.0a), run the tests and the benchmark suite in its quick CPU mode. No
# GPU needed; GPU tests skip themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
step() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "dependencies"
# torch's CPU build (the CUDA wheels are several GB and no GPU is here); then the test tools.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
# triton (its interpreter runs Triton solutions on the CPU) and apache-tvm-ffi (FlashInfer-Bench
# style CUDA/C++ solutions) let the registry tests cover those builders too.
$PY -m pip install -q "pytest>=7" "pytest-benchmark>=4" pytest-xdist triton apache-tvm-ffi
# matplotlib reads the HTML report's browser screenshot in tests/report (the package does not need it).
$PY -m pip install -q matplotlib
# transformers (the optional extra) lets tests/integrations check opforge.patch on tiny random models.
$PY -m pip install -q "transformers>=5.0"
# ray (the optional extra opforge[ray]) lets tests/runner/test_ray_*.py run `opforge run --ray` on a
# simulated cluster of several Ray nodes on this machine (they skip without it).
$PY -m pip install -q "ray>=2.10"
# A headless browser renders the HTML report in tests/report (CI runs as root on Debian).
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

step "build (CUDA_ARCH_LIST=${CUDA_ARCH_LIST:-9.0a})"
start=$(date +%s)
CUDA_ARCH_LIST=${CUDA_ARCH_LIST:-9.0a} OPFORGE_REQUIRE_CUDA=1 $PY -m pip install -q .
echo "build + install: $(( $(date +%s) - start )) s"
wheel_size=$(du -k "$($PY -c 'import opforge._C as c; print(c.__file__)')" | cut -f1)
echo "extension size: ${wheel_size} KiB"

step "build info"
$PY - <<'PY'
import opforge
info = opforge.build_info()
print(info)
assert info["cuda"], "the CI build must contain CUDA kernels"
assert info["cuda_archs"], info
PY

step "device code for 8.0 (in the default build) and 10.0a (the hardware FP4 path)"
# The build above compiles for one arch; the default wheel also holds 8.0 code, and the NVFP4
# kernel has a path only Blackwell-family targets compile. Device code only, as the build's flags.
start=$(date +%s)
for arch in 80 100a; do
  for source in cuda/*.cu; do
    "${CUDACXX:-nvcc}" -O3 -DNDEBUG -std=c++17 "--generate-code=arch=compute_${arch},code=[sm_${arch}]" -Icuda -cubin \
      -o /dev/null "$source"
  done
done
echo "sm_80 and sm_100a device code: $(( $(date +%s) - start )) s"

step "tests"
# The browser tests of the HTML report fail instead of skipping when chromium is missing.
export OPFORGE_REQUIRE_BROWSER=1
# python/ is not on sys.path here, so the tests import the installed package and its extension.
# One pytest worker per core; a file's tests stay on one worker, so a module's shared fixture
# (a benchmark run, a build) is made once. Then the rest of the exhaustive sweeps (-m slow: on a
# CPU a few seconds; their CUDA cases skip here).
$PY -m pytest tests -q -p no:cacheprovider -n auto --dist loadfile
$PY -m pytest tests -q -p no:cacheprovider -m slow

step "benchmarks (quick CPU mode)"
OPFORGE_BENCH_QUICK=1 $PY -m pytest bench -q -p no:cacheprovider
$PY bench/roofline.py --dry-run
# The paged-decode benchmark's every case on tiny CPU tensors (the Triton column's interpreter
# would take a minute; the Triton solution is tested in tests/).
$PY bench/paged_decode_attention.py --dry-run --impls opforge,sdpa
$PY bench/norm_launch_sweep.py --dry-run
$PY bench/decode_placement.py --dry-run
$PY bench/decode_placement.py --dry-run --cases scale:1x4096,gelu_tanh_and_mul:4x14336  # --cases, ops off the default list
