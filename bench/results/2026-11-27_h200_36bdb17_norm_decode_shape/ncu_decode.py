"""ncu target: each implementation of a few decode cases, called REPEATS times inside the profiled range."""
import os, sys
sys.path.insert(0, "bench")
from ncu_ranges import norm_calls, profile_each

CASES = [("rmsnorm", 1, 1024), ("rmsnorm", 32, 1024), ("rmsnorm", 256, 512), ("gemma_rmsnorm", 32, 4096),
         ("rmsnorm", 1, 4096), ("rmsnorm", 1, 2048), ("scale", 1, 4096)]
profile_each(norm_calls(CASES), warmup=5, repeats=int(os.environ.get("REPEATS", "1")))
