"""Prefetch / occupancy A/B of the NVFP4 GEMV kernel, one build, forced plans."""
import json, os, sys
import torch
from opforge import _C
sys.path.insert(0, "bench")
import nvfp4_gemv as nb  # noqa: E402
import timing  # noqa: E402

SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4), (8192, 8192, 1), (2048, 7168, 4), (4096, 16384, 2),
          (256, 7168, 8), (128, 7168, 1)]
CONFIGS = [(-1, 0), (-1, 1), (-1, 2), (-1, 3), (-1, 4), (-1, 6), (2, 0), (2, 2), (4, 0), (4, 2)]
st = torch.cuda.current_stream().cuda_stream


class A:
    dry_run = False
    layout = "task"


ctx = nb.Ctx(A, True)
ctx.copy_gbps = timing.copy_bandwidth_gbps(True)
print(f"copy {ctx.copy_gbps:.0f} GB/s", flush=True)
out = {"copy_gbps": ctx.copy_gbps, "gpu": torch.cuda.get_device_name(), "rows": []}
read = nb.read_only_fn()
for m, k, l in SHAPES:
    d = nb.definition_for(m, k)
    by = nb.nvfp4_bytes(m, k, l)
    sets = nb.make_sets(d, l, nb.n_sets_for(by, ctx), "cuda", "task")
    for s in sets:
        del s["a_bf16"], s["b_bf16"]
    ws = torch.empty(1 << 22, device="cuda")
    base = None
    for rep in range(2):
        row = {"shape": [m, k, l], "rep": rep, "cfg": {}}
        for bps, pf in CONFIGS:
            def fn(s, bps=bps, pf=pf):
                a, b, sa, sb = s["inputs"][:4]
                _C.nvfp4_gemv(s["c"], a, b, sa, sb, ws, st, True, blocks_per_sm=bps, prefetch=pf)
            fn(sets[0]); torch.cuda.synchronize()
            if base is None:
                base = sets[0]["c"].clone()
            same = bool(torch.equal(sets[0]["c"], base))
            us = timing.device_time_us(fn, [(s,) for s in sets], True, 0.1)
            b2b = nb.back_to_back_us(fn, sets)
            row["cfg"][f"bps{bps}-pf{pf}"] = {"us": us, "b2b": b2b, "same": same}
        us = timing.device_time_us(read, [(s,) for s in sets], True, 0.1)
        b2b = nb.back_to_back_us(read, sets)
        row["read"] = {"us": us, "b2b": b2b}
        out["rows"].append(row)
        pct = lambda t: 100 * by / (t * 1e3) / ctx.copy_gbps
        print(f"{m}x{k}x{l} rep{rep} read {us:.1f}/{b2b:.1f} us ({pct(us):.0f}%/{pct(b2b):.0f}%)", flush=True)
        for name, r in row["cfg"].items():
            print(f"   {name:10s} {r['us']:7.1f} ({pct(r['us']):3.0f}%)  b2b {r['b2b']:7.1f} ({pct(r['b2b']):3.0f}%)"
                  f"{'' if r['same'] else '  DIFFERENT OUTPUT'}", flush=True)
    del sets
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "ab.json"), "w") as f:
    json.dump(out, f, indent=1)
