"""ncu target: the large norms where torch.compile leads (one call each, caches flushed by ncu)."""
import sys
import torch
sys.path.insert(0, "bench")
from ncu_ranges import norm_calls, profile_each

CASES = [("fused_add_rmsnorm", 32768, 4096, torch.bfloat16), ("rmsnorm", 32768, 4096, torch.float32),
         ("rmsnorm", 32768, 4096, torch.bfloat16)]
profile_each(norm_calls(CASES))
