#!/usr/bin/env bash
# ci/gpu_ab.sh 'bash bench/results/2026-11-27_h200_5c7cd4a_act_decode_access/run.sh' RULE.patch RULE1024.patch: variant 0 the tree before the rule
# (5c7cd4a), 1 the rule as committed (1536 threads per SM), 2 the same at 1024.
set -u
C=silu_and_mul:16x11008,silu_and_mul:24x11008,silu_and_mul:32x11008,silu_and_mul:40x11008,silu_and_mul:48x11008,silu_and_mul:64x11008,silu_and_mul:96x11008,silu_and_mul:16x14336,silu_and_mul:24x14336,silu_and_mul:32x14336,silu_and_mul:48x14336,gelu_and_mul:32x14336,gelu_and_mul:48x14336,gelu_and_mul:64x11008,gelu_and_mul:32x11008,gelu_tanh_and_mul:32x11008,gelu_tanh_and_mul:64x11008,silu_and_mul:1x14336,silu_and_mul:128x11008
timeout 170 python3 bench/decode_placement.py --cases $C --trials 8 --out $OUT/dp-$VARIANT.json --markdown $OUT/dp-$VARIANT.md > $OUT/dp-$VARIANT.log 2>&1
echo "dp rc=$?"
if [ "$VARIANT" = 1 ]; then
  timeout 100 python3 -m pytest tests/test_activation.py -m gpu -q -p no:cacheprovider -n 8 > $OUT/act_tests.log 2>&1
  echo "act tests rc=$?: $(tail -1 $OUT/act_tests.log)"; grep -E "^FAILED" $OUT/act_tests.log | head -5
fi
