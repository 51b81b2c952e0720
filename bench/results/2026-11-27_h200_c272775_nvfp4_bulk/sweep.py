import os, sys, time, itertools
sys.path.insert(0, "bench")
import torch
import nvfp4_gemv as nb
import timing
from opforge import _C

class A: dry_run=False; layout="task"
ctx = nb.Ctx(A, True)
ctx.copy_gbps = timing.copy_bandwidth_gbps(True)
print("copy", round(ctx.copy_gbps))
variants = [(41,4,2),(41,3,3),(41,5,2),(42,2,2),(42,3,1),(22,4,2),(22,3,3),(21,6,3)]
old2 = [(3, 1<<30, 2, 0, 1), (3, 1<<30, 2, 10000000, 1), (4, 1<<30, 2, 10000000, 1), (3, 4096, 2, 10000000, 1), (6, 1<<30, 1, 10000000, 1), (3, 1<<30, 2, 1000, 1)]
old = [(3, 1<<30, 2), (3, 1024, 2), (3, 4096, 2), (5, 1<<30, 2), (5, 2048, 2), (6, 1024, 2), (10, 2048, 1), (10, 1<<30, 1)]
if len(sys.argv) > 1: variants = eval(sys.argv[1])
shapes = [(7168,16384,1),(4096,7168,8),(7168,2048,4),(256,7168,8)][:int(os.environ.get('NSHAPES','4'))]
with torch.no_grad():
  for m,k,l in shapes:
    d = nb.definition_for(m,k); nbytes = nb.nvfp4_bytes(m,k,l)
    sets = nb.make_sets(d, l, nb.n_sets_for(nbytes, ctx), "cuda", "task")
    want = d.reference_fn()(*sets[0]["inputs"])
    fns, _ = nb.implementations(d)
    def row(label, fn):
        ok = label == "read only" or nb.check(d, "opforge", fn, sets[0], want)["passed"]
        us = timing.device_time_us(fn, [(s,) for s in sets], True, 0.1)
        b2b = nb.back_to_back_us(fn, sets)
        print(f"{m}x{k}x{l} {label:28s} {us:7.2f} us {100*nbytes/us/1e3/ctx.copy_gbps:5.1f}%  b2b {b2b:7.2f} us {100*nbytes/b2b/1e3/ctx.copy_gbps:5.1f}%  {'ok' if ok else 'WRONG'}", flush=True)
    row("opforge", fns["opforge"]); row("read only", fns["read only"])
    for cfg, st, bps in variants:
        os.environ["OPF_BULK_STAGES"]=str(st); os.environ["OPF_BULK_CFG"]=str(cfg); os.environ["OPF_BULK_BPS"]=str(bps)
        try: row(f"bulk2 cfg{cfg} s{st} b{bps}", fns["opforge bulk"])
        except Exception as e: print(m,k,l, st,pc,bps, "ERR", str(e)[:200])
    del sets; torch.cuda.empty_cache()
