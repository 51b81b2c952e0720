#!/usr/bin/env bash
# Variants (ci/gpu_ab.sh, from the repository root):
#   ci/gpu_ab.sh 'bash bench/results/2026-11-27_h200_afafac3_paged_dense_and_nvfp4_in_flight/run.sh' \
#     bench/results/2026-11-27_h200_2af1908_paged_decode_even_on_gpu/even_on_gpu_dense.patch \
#     bench/results/2026-11-27_h200_afafac3_paged_dense_and_nvfp4_in_flight/nvfp4_in_flight12.patch
# 0 = afafac3, 1 = + the dense numbering, 2 = + 12 vectors of A in flight
set -u
if [ "$VARIANT" = 1 ]; then
  timeout 130 python3 -m pytest tests/test_paged_decode_attention.py -m gpu -q -p no:cacheprovider -n 8 > $OUT/pda_tests.log 2>&1
  echo "pda tests rc=$?: $(tail -1 $OUT/pda_tests.log)"; grep -E "^FAILED" $OUT/pda_tests.log | head -5
fi
if [ "$VARIANT" = 2 ]; then
  timeout 120 python3 -m pytest tests/test_nvfp4.py -m gpu -q -p no:cacheprovider -n 8 > $OUT/nvfp4_tests.log 2>&1
  echo "nvfp4 tests rc=$?: $(tail -1 $OUT/nvfp4_tests.log)"; grep -E "^FAILED" $OUT/nvfp4_tests.log | head -5
fi
if [ "$VARIANT" != 2 ]; then
for cfg in "8 16" "4 1"; do set -- $cfg
timeout 90 python3 bench/paged_decode_attention.py --kv-heads $1 --page-size $2 --batches 8,32,128 --contexts 512,2048,8192 --cases 32x512,32x2048,32x8192,128x2048,32xuniform,32xtail --impls opforge,sdpa --splits 1w4,2w4,4w4 --out $OUT/pda_kv$1_ps$2-$VARIANT.json --markdown $OUT/pda_kv$1_ps$2-$VARIANT.md > $OUT/pda_kv$1_ps$2-$VARIANT.log 2>&1
echo "bench kv$1 ps$2 rc=$?"
done
fi
if [ "$VARIANT" != 1 ]; then
  timeout 60 python3 bench/nvfp4_gemv.py --out $OUT/nvfp4-$VARIANT.json --markdown $OUT/nvfp4-$VARIANT.md > $OUT/nvfp4-$VARIANT.log 2>&1
  echo "nvfp4 bench rc=$?"; grep -A4 "^## Target" $OUT/nvfp4-$VARIANT.md
fi
