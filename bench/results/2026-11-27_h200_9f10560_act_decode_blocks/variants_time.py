import ctypes, statistics, sys, torch, torch.nn.functional as F
lib = ctypes.CDLL(sys.argv[1])
lib.launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p]
torch.manual_seed(0)
N_NODES, PLACEMENTS = 100, 12
def time_fn(make):  # make(placement) -> zero-arg fn launching once
    res = []
    for p in range(PLACEMENTS):
        fn = make(p)
        for _ in range(3): fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for _ in range(N_NODES): fn()
        g.replay(); torch.cuda.synchronize()
        ts = []
        for _ in range(7):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record(); g.replay(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3 / N_NODES)
        res.append(min(ts))
    return statistics.median(res)
pool = torch.empty(64 << 20, dtype=torch.bfloat16, device="cuda")
def bufs(p, n_in, n_out):
    off = p * (1 << 18) + 4096 * (p % 3)
    return pool[off:off + n_in].normal_(), pool[off + (1 << 20): off + (1 << 20) + n_out]
def ours(v, n, n_in, n_out, f=0.5):
    def make(p):
        x, o = bufs(p, n_in, n_out)
        def fn():
            r = lib.launch(v, o.data_ptr(), x.data_ptr(), n, f, torch.cuda.current_stream().cuda_stream)
            assert r == 0, r
        return fn
    return make
def check(v, n, n_in, n_out, want_fn):
    x, o = bufs(0, n_in, n_out)
    lib.launch(v, o.data_ptr(), x.data_ptr(), n, 0.5, torch.cuda.current_stream().cuda_stream); torch.cuda.synchronize()
    return (o.float() - want_fn(x).float()).abs().max().item()
n = 4096
scale_c = torch.compile(lambda x: x * 0.5, dynamic=False, fullgraph=True)
print("scale 1x4096 bf16")
for v, name in [(0, "once 256t x8 (ours)"), (1, "once 128t x8"), (2, "once 128t x4"), (3, "once 128t x2"), (4, "once 128t x1"), (5, "once 64t x8"), (0, "once 256t x8 (ours) again")]:
    err = check(v, n, n, n, lambda x: x * 0.5)
    print(f"  {name:28s} {time_fn(ours(v, n, n, n)):.3f} us  err {err:.3g}", flush=True)
def compiled_scale(p):
    x, o = bufs(p, n, n)
    return lambda: scale_c(x)
print(f"  {'torch.compile':28s} {time_fn(compiled_scale):.3f} us")
import opforge
def op_scale(p):
    x, o = bufs(p, n, n)
    return lambda: opforge.scale(x.view(1, n), 0.5, out=o.view(1, n))
print(f"  {'opforge.scale':28s} {time_fn(op_scale):.3f} us")
d = 14336
silu_c = torch.compile(lambda x: F.silu(x[..., :d]) * x[..., d:], dynamic=False, fullgraph=True)
print("silu_and_mul 1x14336 bf16")
ref = lambda x: F.silu(x[:d].float()) * x[d:].float()
for v, name in [(10, "once 64t x2 (ours)"), (11, "once 128t x1"), (12, "once 128t x2"), (13, "once 64t x1"), (14, "once 32t x2"), (15, "once 64t x4"), (10, "once 64t x2 (ours) again")]:
    err = check(v, d, 2 * d, d, ref)
    print(f"  {name:28s} {time_fn(ours(v, d, 2 * d, d)):.3f} us  err {err:.3g}", flush=True)
def compiled_silu(p):
    x, o = bufs(p, 2 * d, d)
    x = x.view(1, 2 * d)
    return lambda: silu_c(x)
print(f"  {'torch.compile':28s} {time_fn(compiled_silu):.3f} us")
def op_silu(p):
    x, o = bufs(p, 2 * d, d)
    return lambda: opforge.silu_and_mul(x.view(1, 2 * d), out=o.view(1, d))
print(f"  {'opforge.silu_and_mul':28s} {time_fn(op_silu):.3f} us")
