"""Large-batch norm launches (4+ vectors per thread), device time with inputs rotated past 2x L2."""
import math, statistics, sys, json, os
import torch
sys.path.insert(0, "bench")
import opspecs, timing
from opspecs import SPEC
L2 = timing.l2_bytes()
CASES = [(op, r, h, dt) for op in ("rmsnorm", "fused_add_rmsnorm") for r, h, dt in
         [(4096, 7168, "bf16"), (16384, 7168, "bf16"), (32768, 8192, "bf16"), (4096, 16384, "bf16"),
          (32768, 16384, "bf16"), (32768, 4096, "fp32"), (4096, 8192, "fp32")]]
res = {}
for op, rows, hidden, dt in CASES:
    spec, dtype = SPEC[op], opspecs.DTYPES[dt]
    nbytes = spec.bytes(rows, hidden, torch.finfo(dtype).bits // 8)
    n = int(min(max(math.ceil(2 * L2 / nbytes) + 1, 2), 64))
    sets = opspecs.make_input_sets(spec, rows, hidden, dtype, "cuda", n)
    fn = lambda *t: spec.opforge_call(t)
    vals = []
    for _ in range(3):
        t = timing.device_timing(fn, sets, True, 0.1)
        vals.append(1e3 * t["median_ms"])
    us = statistics.median(vals)
    res[f"{op} {rows}x{hidden} {dt}"] = us
    print(f"{op} {rows}x{hidden} {dt}: {us:.2f} us ({nbytes / us / 1e3:.0f} GB/s)", flush=True)
    del sets
    torch.cuda.empty_cache()
json.dump(res, open(os.environ.get("OUTJSON", "/dev/null"), "w"))
