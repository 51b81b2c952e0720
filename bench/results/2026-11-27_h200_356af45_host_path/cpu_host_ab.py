"""Host ns per call on 16-element CPU tensors (min of 15 timeit repeats of 20000 calls); argv[1]: "new"
(stream=None) or "old" (stream=0, the binding before 356af45). Run alternately with each build first
on PYTHONPATH."""
import timeit, torch, opforge, statistics as st, sys
from opforge import _ext
_C=_ext._C
x=torch.randn(1,16); w=torch.randn(16); o=torch.empty_like(x); r=torch.randn(1,16)
S=None if sys.argv[1]=="new" else 0
cases = {
 "rmsnorm out=": "opforge.rmsnorm(x, w, 1e-6, out=o)",
 "fused_add inplace": "opforge.fused_add_rmsnorm(x, r, w, 1e-6, out=x, residual_out=r)",
 "silu_and_mul": "opforge.silu_and_mul(x, out=o[:, :8])",
 "validate only": "_C.norm(o, x, None, None, w, 1e-6, False, S, False, -1, False)",
 "torch.mul out=": "torch.mul(x, 1.0, out=o)",
}
res=[]
for k,s in cases.items():
    ts=timeit.repeat(s, globals=globals(), number=20000, repeat=15)
    res.append(f"{k} {min(ts)/20000*1e9:.0f}")
print(sys.argv[1], " | ".join(res))
