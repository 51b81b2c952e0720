"""Per-kernel device times (torch.profiler) of forced paged decode plans on fixed inputs: the ring
kernel's cuts against page ranges with and without runs per request, merged by their own grid or
by the second kernel (merge_kernel=True), and at several grid sizes. Inputs are not rotated, so
part of the KV may stay in L2: compare rows with each other, not with the benchmark.
Run on the GPU machine after installing a build of 6305437 (fused_merge.patch on 00c6b7a): python3 kernel_times.py"""
import math, sys, torch
from opforge import _C
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
def setup(batch, ctx, hq, hkv, ps, dev="cuda"):
    pages = ctx // ps
    n = batch * pages
    perm = torch.randperm(n + 8, device=dev)[:n].int()
    k = torch.randn(n + 8, ps, hkv, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, hq, 128, device=dev, dtype=torch.bfloat16)
    indptr = (torch.arange(batch + 1, device=dev) * pages).int()
    last = torch.full((batch,), ps, device=dev, dtype=torch.int32)
    out = torch.empty_like(q); lse = torch.empty(batch, hq, device=dev)
    return q, k, v, indptr, perm, last, out, lse
stream = torch.cuda.current_stream().cuda_stream
R = lambda n, e, m=False: dict(splits=0, token_warps=n, even_splits=e, merge_kernel=m)
for (batch, ctx, hq, hkv, ps), plans in [((32, 2048, 32, 8, 16), [dict(splits=1, token_warps=4), R(33, 1), R(33, 1, True), R(32, 1)]),
                                        ((32, 2048, 32, 4, 16), [dict(splits=1, token_warps=4), R(66, 1), R(66, 1, True), R(32, 1), R(40, 1), R(66, 2)]),
                                        ((32, 2048, 32, 4, 1), [dict(splits=2, token_warps=4), R(66, 2), R(66, 2, True), R(66, 1), R(32, 1)])]:
    q, k, v, indptr, idx, last, out, lse = setup(batch, ctx, hq, hkv, ps)
    for plan in plans:
        need = _C.paged_decode_attention(out, lse, q, k, v, indptr, idx, last, None, 1 / math.sqrt(128), stream, True, **plan)
        ws = torch.empty(max(need, 1), device="cuda") if need else None
        f = lambda: _C.paged_decode_attention(out, lse, q, k, v, indptr, idx, last, ws, 1 / math.sqrt(128), stream, True, **plan)
        for _ in range(20): f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(50): f()
            torch.cuda.synchronize()
        ev = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                ev.setdefault(__import__("re").search(r"paged_decode_\w+", e.name).group(0) if "paged_decode" in e.name else e.name[:30], []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
        print((batch, ctx, hq, hkv, ps), plan, {k2: f"{sum(x)/len(x):.1f}us x{len(x)}" for k2, x in ev.items()})
