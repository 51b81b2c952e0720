# Alternated per process by: for i in 1..6; for v in 1 0: V=$v PYTHONPATH=build-$v FI_DIR=<FlashInfer csrc/include> taskset -c 5 python3 gpu_host_ab.py
"""Host µs per call of plain op calls (CUDA tensors), one build; one JSON line to stdout."""
import functools, json, os, sys, statistics
sys.path.insert(0, "bench")
import torch
from opforge.bench.timing import host_loop_ms
import opforge
fi = None
if os.environ.get("FI_DIR"):
    import flashinfer_norm_host as fh
    fi = fh.build_flashinfer_norm(os.environ["FI_DIR"], "/tmp/fibuild")
H = 4096
x = torch.randn(1, H, device="cuda").bfloat16(); r = torch.randn_like(x); w = torch.randn(H, device="cuda").bfloat16()
o = torch.empty_like(x)
g = torch.randn(1, 2 * 14336, device="cuda").bfloat16(); go = torch.empty(1, 14336, device="cuda").bfloat16()
cases = {
    "rmsnorm": functools.partial(opforge.rmsnorm, x, w, 1e-6, out=o),
    "fused_add_rmsnorm": functools.partial(opforge.fused_add_rmsnorm, x, r, w, 1e-6, out=x, residual_out=r),
    "silu_and_mul": functools.partial(opforge.silu_and_mul, g, out=go),
    "scale": functools.partial(opforge.scale, x, 1.0, out=o),
    "torch.mul": functools.partial(torch.mul, x, 1.0, out=o),
}
if fi is not None:
    cases["fi rmsnorm"] = functools.partial(fi.rmsnorm, o, x, w, 1e-6, False)
    cases["fi fused_add"] = functools.partial(fi.fused_add_rmsnorm, x, r, w, 1e-6, False)
res = {k: [] for k in cases}
for _ in range(int(os.environ.get("ROUNDS", "5"))):
    for k, f in cases.items():
        res[k].append(1e3 * host_loop_ms(f, (), cuda=True, calls=2000, repeats=5))
print(json.dumps({"variant": os.environ.get("V"), **{k: min(v) for k, v in res.items()}}))
