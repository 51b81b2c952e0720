"""Device µs of one launch (CUDA events, inputs rotated past 2x L2) of scale / silu_and_mul / gelu_and_mul at mid sizes."""
import json, os, sys
sys.path.insert(0, "bench")
import torch, torch.nn.functional as F
import timing, opforge
L2 = timing.l2_bytes()
out = {}
shapes = [(1024, 4096), (2048, 4096), (4096, 4096), (8192, 4096), (16384, 4096), (1024, 11008), (1024, 14336), (4096, 14336)]
for op in os.environ.get("OPS", "scale,silu_and_mul,gelu_and_mul").split(","):
    for rows, h in shapes:
        cols = 2 * h if op != "scale" else h
        nbytes = rows * cols * 2
        n = max(2, (2 * L2) // nbytes + 1)
        sets = []
        for _ in range(n):
            x = torch.randn(rows, cols, device="cuda").bfloat16()
            o = torch.empty(rows, h, device="cuda").bfloat16()
            sets.append((x, o))
        if op == "scale":
            f = lambda x, o: opforge.scale(x, 0.5, out=o)
            g = lambda x, o: torch.mul(x, 0.5, out=o)
        elif op == "silu_and_mul":
            f = lambda x, o: opforge.silu_and_mul(x, out=o)
            g = None
        else:
            f = lambda x, o: opforge.gelu_and_mul(x, out=o)
            g = None
        us = timing.device_time_us(f, sets, True, target_s=0.2)
        ref = timing.device_time_us(g, sets, True, target_s=0.2) if g else None
        out[f"{op} {rows}x{h}"] = (us, ref)
        print(f"{op} {rows}x{h} {us:.2f} {ref if ref is None else round(ref, 2)}", flush=True)
print(json.dumps({"unroll": os.environ.get("OPF_MAP_UNROLL", "plan"), "cases": out}))
