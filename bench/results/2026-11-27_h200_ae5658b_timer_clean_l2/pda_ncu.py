"""ncu target: paged decode h32_kv4 at batch 32 (opforge's plan with max_kv_len, and SDPA on gathered KV)."""
import sys, types
import torch
sys.path.insert(0, "bench")
import paged_decode_attention as pda

calls = []
for ps, ctxlen in ((1, 2048), (16, 2048), (1, 8192)):
    args = types.SimpleNamespace(heads=32, kv_heads=4, head_dim=128, page_size=ps, dtype="bf16", max_kv_len=True)
    case = pda.Case(f"ps{ps} 32x{ctxlen}", [ctxlen] * 32, args, "cuda", 1)
    s = case.sets[0]
    s["gathered"] = case.gathered(s)
    fns, _ = pda.implementations(case)
    for name in ("opforge", "sdpa"):
        f = fns[name]
        for _ in range(3):
            f(s)
        calls.append((f"{case.label} {name}", f, s, case))
torch.cuda.synchronize()
for label, f, s, case in calls:
    print("CALL", label, flush=True)
    torch.cuda.profiler.start()
    f(s)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
