set -u
R=$OUT/v$VARIANT; mkdir -p $R
python3 bench/results/2026-11-28_h200_20d18d7_paged_decode_spread_runs/kernel_times.py > $R/kernel_times.txt 2>&1
for cfg in "8 16 16x2048,32x2048,32xuniform,32xtail,32xskew2" "4 1 32x2048,32x8192,32xuniform,32xtail" "4 16 32x2048,32x8192,32xuniform,32xtail"; do
  set -- $cfg
  python3 bench/paged_decode_attention.py --impls opforge,sdpa --kv-heads $1 --page-size $2 --batches 16,32 --contexts 2048,8192 --cases $3 --out $R/kv$1_ps$2.json --markdown $R/kv$1_ps$2.md > $R/kv$1_ps$2.log 2>&1 || tail -5 $R/kv$1_ps$2.log
done
if [ "$VARIANT" = "3" ]; then
  python3 -m pytest tests/test_paged_decode_attention.py -m gpu -q -p no:cacheprovider -n 4 > $R/tests.log 2>&1; echo "tests: $(tail -1 $R/tests.log)"
fi
