"""Per-kernel device times (torch.profiler) of forced paged decode plans: the ring kernel's cut
against page ranges in runs per request, on fixed inputs (not rotated: compare rows)."""
import math, re, sys, torch
from opforge import _C
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
def setup(batch, ctx, hq, hkv, ps, dev="cuda"):
    pages = ctx // ps; n = batch * pages
    perm = torch.randperm(n + 8, device=dev)[:n].int()
    k = torch.randn(n + 8, ps, hkv, 128, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
    q = torch.randn(batch, hq, 128, device=dev, dtype=torch.bfloat16)
    indptr = (torch.arange(batch + 1, device=dev) * pages).int()
    last = torch.full((batch,), ps, device=dev, dtype=torch.int32)
    return q, k, v, indptr, perm, last, torch.empty_like(q), torch.empty(batch, hq, device=dev)
stream = torch.cuda.current_stream().cuda_stream
R = lambda n, e: dict(splits=0, token_warps=n, even_splits=e)
for (batch, ctx, hq, hkv, ps), plans in [((32, 2048, 32, 8, 16), [dict(splits=1, token_warps=4), R(33, 1)]),
                                        ((16, 2048, 32, 8, 16), [dict(splits=1, token_warps=4), dict(splits=2, token_warps=4), R(33, 1)]),
                                        ((32, 2048, 32, 4, 16), [dict(splits=1, token_warps=4), R(66, 1), R(66, 0)]),
                                        ((32, 8192, 32, 4, 16), [dict(splits=1, token_warps=4), R(66, 1)]),
                                        ((32, 2048, 32, 4, 1), [dict(splits=2, token_warps=4), R(66, 2), R(66, 1)])]:
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
                name = re.search(r"paged_decode_\w+", e.name).group(0) if "paged_decode" in e.name else e.name[:30]
                ev.setdefault(name, []).append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
        print((batch, ctx, hq, hkv, ps), plan, {k2: f"{sum(x)/len(x):.1f}us x{len(x)}" for k2, x in ev.items()}, flush=True)
