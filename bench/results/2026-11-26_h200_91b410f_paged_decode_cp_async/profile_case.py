import sys, torch
from opforge import _C
from opforge._ext import cuda_stream
batch, ctx, splits = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
H, KV, D, PS = 32, 8, 128, 16
pages_per = ctx // PS
num_pages = batch * pages_per
dev = "cuda"
q = torch.randn(batch, H, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(num_pages, PS, KV, D, device=dev, dtype=torch.bfloat16)
v = torch.randn_like(k)
indptr = (torch.arange(batch + 1, dtype=torch.int32) * pages_per).to(dev)
indices = torch.randperm(num_pages, dtype=torch.int32).to(dev)
out = torch.empty_like(q); lse = torch.empty(batch, H, device=dev)
stream = cuda_stream(0)
need = _C.paged_decode_attention(out, lse, q, k, v, indptr, indices, None, None, D ** -0.5, stream, True, splits)
ws = torch.empty(max(need, 1), device=dev) if need else None
for _ in range(3):
    _C.paged_decode_attention(out, lse, q, k, v, indptr, indices, None, ws, D ** -0.5, stream, True, splits)
torch.cuda.synchronize()
