import sys, torch, opforge
from opforge import _C
sys.path.insert(0, "bench")
import nvfp4_gemv as nb
from opforge.bench import generate_inputs
shapes = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)]
for m, k, l in shapes:
    d = nb.definition_for(m, k)
    class A: dry_run=False; layout="task"
    ctx = nb.Ctx(A, True)
    sets = nb.make_sets(d, l, nb.n_sets_for(nb.nvfp4_bytes(m, k, l), ctx), "cuda", "task")
    st = torch.cuda.current_stream().cuda_stream
    res = {}
    for streaming in (1, 0):
        def f(s, streaming=streaming):
            a, b, sa, sb = s["inputs"][:4]
            _C.nvfp4_gemv(s["c"], a, b, sa, sb, None, st, True, streaming=streaming)
        for s in sets[:3]: f(s)
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        n = 200
        ev[0].record()
        for i in range(n): f(sets[i % len(sets)])
        ev[1].record(); torch.cuda.synchronize()
        res[streaming] = ev[0].elapsed_time(ev[1]) * 1e3 / n
    by = nb.nvfp4_bytes(m, k, l)
    print(f"{m}x{k}x{l}: streaming {res[1]:.1f} us ({by/res[1]/1e3:.0f} GB/s), tasks {res[0]:.1f} us ({by/res[0]/1e3:.0f} GB/s)", flush=True)
