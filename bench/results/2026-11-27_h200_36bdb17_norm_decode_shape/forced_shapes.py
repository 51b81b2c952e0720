"""Forced norm launch shapes (vectors per thread) against Liger at decode sizes, over placements."""
import random, statistics, sys
import torch
sys.path.insert(0, "bench")
import opspecs, timing
from opspecs import SPEC
import opforge
from opforge import _ext
_C = _ext._C
stream = _ext.cuda_stream

from roofline import configure_dynamo
configure_dynamo()
liger, _ = opspecs.liger_peers()
rng = random.Random(0)
CASES = [("rmsnorm", r, 1024) for r in (1, 8, 32, 256)] + [("rmsnorm", r, 512) for r in (1, 32, 256)] + [
    ("fused_add_rmsnorm", 1, 1024), ("fused_add_rmsnorm", 32, 1024), ("rmsnorm", 1, 768)]
TRIALS = 8
import os
with torch.no_grad():
    for op, rows, hidden in CASES:
        spec = SPEC[op]
        gemma = op.startswith("gemma")
        add = "fused_add" in op
        base = opspecs.make_input_sets(spec, rows, hidden, torch.bfloat16, "cuda", 1)[0]
        times = {}
        comp = torch.compile(spec.formula, dynamic=False, fullgraph=True)
        keep = []
        for _ in range(TRIALS):
            spacer, inp = opspecs.placed_copy(base, rng)
            keep.append(spacer)
            o = torch.empty_like(inp[0])
            if add:
                x, r, w = inp
                ro = torch.empty_like(r)
                mk = lambda vpt, x=x, r=r, w=w, o=o, ro=ro: (lambda: _C.norm(o, x, r, ro, w, 1e-6, gemma, stream(0), True, vpt, False))
            else:
                x, w = inp
                mk = lambda vpt, x=x, w=w, o=o: (lambda: _C.norm(o, x, None, None, w, 1e-6, gemma, stream(0), True, vpt, False))
            for rpb in ("", "1"):
                if rpb:
                    os.environ["OPF_NORM_RPB1"] = "1"
                else:
                    os.environ.pop("OPF_NORM_RPB1", None)
                for vpt in (-1, 1, 2, 4, 8):
                    pass
                    try:
                        f = mk(vpt); f(); torch.cuda.synchronize()
                        times.setdefault(f"v{vpt}{'r' if rpb else ''}", []).append(timing.replay_or_host_us(f, True))
                    except Exception as e:
                        times.setdefault(f"v{vpt}{'r' if rpb else ''}", []).append(float("nan"))
            os.environ.pop("OPF_NORM_RPB1", None)
            comp(*inp); torch.cuda.synchronize()
            times.setdefault("compile", []).append(timing.replay_or_host_us(lambda: comp(*inp), True))
            if spec.liger in liger:
                peer = liger[spec.liger][1]
                times.setdefault("liger", []).append(timing.replay_or_host_us(lambda: peer(*inp), True))
        print(f"{op} {rows}x{hidden}: " + "  ".join(f"{k} {statistics.median(v):.3f}" for k, v in times.items()), flush=True)
