"""ncu target: paged decode h32_kv4 at batch 32 (opforge's plan with max_kv_len, and SDPA on gathered KV)."""
import sys, types
sys.path.insert(0, "bench")
import paged_decode_attention as pda
from ncu_ranges import profile_each

calls = []
for ps, ctxlen in ((1, 2048), (16, 2048), (1, 8192)):
    args = types.SimpleNamespace(heads=32, kv_heads=4, head_dim=128, page_size=ps, dtype="bf16", max_kv_len=True)
    case = pda.Case(f"ps{ps} 32x{ctxlen}", [ctxlen] * 32, args, "cuda", 1)
    s = case.sets[0]
    s["gathered"] = case.gathered(s)
    fns, _ = pda.implementations(case)
    calls += [(f"{case.label} {name}", lambda f=fns[name], s=s: f(s)) for name in ("opforge", "sdpa")]
profile_each(calls)
