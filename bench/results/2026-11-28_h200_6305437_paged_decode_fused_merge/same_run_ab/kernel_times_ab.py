import math, torch, os
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
R = lambda n, e: dict(splits=0, token_warps=n, even_splits=e)
for shape, plans in [((32, 2048, 32, 8, 16), [dict(splits=1, token_warps=4), R(33, 1), R(33, 0)]),
                     ((32, 2048, 32, 4, 16), [dict(splits=1, token_warps=4), R(66, 1), R(66, 0)]),
                     ((32, 2048, 32, 4, 1), [dict(splits=2, token_warps=4), R(66, 2), R(66, 0)])]:
    q, k, v, indptr, idx, last, out, lse = setup(*shape)
    for plan in plans:
        need = _C.paged_decode_attention(out, lse, q, k, v, indptr, idx, last, None, 0.088, None, True, **plan)
        ws = torch.empty(max(need, 1), device="cuda")
        f = lambda: _C.paged_decode_attention(out, lse, q, k, v, indptr, idx, last, ws, 0.088, None, True, **plan)
        for _ in range(20): f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(50): f()
            torch.cuda.synchronize()
        ev = {}
        for e in prof.events():
            if e.device_type.name == "CUDA" and "paged_decode" in e.name:
                name = __import__("re").search(r"paged_decode_\w+", e.name).group(0)
                ev.setdefault(name, []).append(e.device_time)
        print(os.environ.get("VARIANT"), shape, plan, {k2: f"{sum(x)/len(x):.1f}us" for k2, x in ev.items()}, flush=True)
