import torch, opforge, math
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
H, KV, D, PS = 32, 8, 128, 16
for B, C in [(8, 512), (32, 512), (128, 512), (1, 8192)]:
    pages_per = C // PS
    num_pages = B * pages_per * 4
    k = torch.randn(num_pages, PS, KV, D, device=dev, dtype=dt); v = torch.randn_like(k)
    q = torch.randn(B, H, D, device=dev, dtype=dt)
    indptr = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * pages_per
    indices = torch.randperm(num_pages, device=dev)[: B * pages_per].to(torch.int32)
    last = torch.full((B,), PS, device=dev, dtype=torch.int32)
    out = torch.empty(B, H, D, device=dev, dtype=dt); lse = torch.empty(B, H, device=dev, dtype=torch.float32)
    # gathered for sdpa
    kg = k[indices.long()].view(B, pages_per * PS, KV, D).transpose(1, 2).contiguous(); vg = v[indices.long()].view(B, pages_per * PS, KV, D).transpose(1, 2).contiguous()
    qg = q.view(B, H, 1, D)
    f_op = lambda: opforge.paged_decode_attention(q, k, v, indptr, indices, 1 / math.sqrt(D), last, out=out, lse=lse, skip_check=True)
    f_sd = lambda: torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, scale=1 / math.sqrt(D), enable_gqa=True)
    for f in (f_op, f_sd):
        for _ in range(5): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20): f_op()
        torch.cuda.synchronize()
        for _ in range(20): f_sd()
        torch.cuda.synchronize()
    print(f"== {B}x{C}")
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by = {}
    for e in evs:
        by.setdefault(e.name[:70], []).append(e.device_time)
    for n, ts in by.items():
        ts.sort(); print(f"  {n:70s} n={len(ts):3d} median {ts[len(ts)//2]:7.2f} us")
    # gaps between consecutive op kernels: first 40 events are ours
    ours = sorted([e for e in evs if "paged" in e.name], key=lambda e: e.time_range.start)
    spans = [(ours[i+1].time_range.end - ours[i].time_range.start) for i in range(0, len(ours) - 1, 2)]
    spans.sort(); print(f"  opforge main start -> merge end median {spans[len(spans)//2]:.2f} us")
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for name, f in (("opforge", f_op), ("sdpa", f_sd)):
        ts = []
        for _ in range(30):
            ev[0].record(); f(); ev[1].record(); torch.cuda.synchronize(); ts.append(ev[0].elapsed_time(ev[1]) * 1e3)
        ts.sort(); print(f"  events {name}: {ts[15]:.2f} us")
