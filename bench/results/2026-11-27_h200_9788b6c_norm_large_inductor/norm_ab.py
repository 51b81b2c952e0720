"""Large norms: shipped / forced shapes / torch.compile / copy, one line of JSON per case."""
import json, os, sys
import torch
sys.path.insert(0, "bench")
import norm_launch_sweep as nls
import opspecs, timing
from opspecs import SPEC
from roofline import configure_dynamo, n_sets_for

nls.VPTS = (-1, 4, 8, 0)
configure_dynamo()
ctx = nls._Ctx(True, False)
copy_gbps = timing.copy_bandwidth_gbps(True)
CASES = [(op, dt, rows, 4096) for dt in ("bf16", "fp32") for op in ("fused_add_rmsnorm", "rmsnorm") for rows in (4096, 32768)]
CASES += [("rmsnorm", "bf16", 8192, 8192), ("fused_add_rmsnorm", "bf16", 8192, 8192)]
for op, dt, rows, hidden in CASES:
    dtype = nls.DTYPES[dt]
    row = nls.measure(op, rows, hidden, ctx, {}, copy_gbps, dtype)
    spec = SPEC[op]
    nbytes = spec.bytes(rows, hidden, dtype.itemsize)
    sets = opspecs.make_input_sets(spec, rows, hidden, dtype, "cuda", n_sets_for(nbytes, ctx))
    comp = torch.compile(spec.formula, dynamic=False, fullgraph=True)
    with torch.no_grad():
        comp(*sets[0])
        row["us"]["compile"] = timing.device_time_us(lambda *a: comp(*a), sets, True, ctx.target_s)
    del sets
    torch.cuda.empty_cache()
    row["dtype"] = dt
    print(json.dumps({k: row[k] for k in ("op", "dtype", "rows", "hidden", "us", "check")}), flush=True)
