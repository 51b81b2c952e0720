"""ncu target: one paged decode call per case (h32_kv4, bf16, random page order), inside the profiled range."""
import sys
import torch
import opforge
sys.path.insert(0, "bench")
from ncu_ranges import profile_each

CASES = [(128, 2048, 1, (1, 4)), (128, 2048, 16, (1, 4)), (32, 2048, 1, (2, 4)), (32, 2048, 16, (1, 4))]
g = torch.Generator(device="cuda").manual_seed(0)
calls = []
for batch, ctx, ps, (splits, tw) in CASES:
    pages_per = ctx // ps
    num_pages = batch * pages_per
    q = torch.randn(batch, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(num_pages, ps, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    indices = torch.randperm(num_pages, device="cuda", generator=g).int()
    indptr = (torch.arange(batch + 1, device="cuda") * pages_per).int()
    last = torch.full((batch,), ps, device="cuda", dtype=torch.int32) if ps > 1 else None
    out = torch.empty_like(q)
    lse = torch.empty(batch, 32, device="cuda", dtype=torch.float32)
    calls.append((f"{batch} {ctx} {ps}", lambda q=q, k=k, v=v, indptr=indptr, indices=indices, last=last, out=out,
                  lse=lse, ctx=ctx: opforge.paged_decode_attention(q, k, v, indptr, indices, kv_last_page_len=last,
                                                                   out=out, lse=lse, max_kv_len=ctx, skip_check=True)))
profile_each(calls)
