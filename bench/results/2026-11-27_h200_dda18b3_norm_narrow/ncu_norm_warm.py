"""ncu target: rmsnorm at rows of 512-1024 elements, each implementation called REPEATS times in the profiled range."""
import os, sys
sys.path.insert(0, "bench")
from ncu_ranges import norm_calls, profile_each

CASES = [("rmsnorm", 1, 1024), ("rmsnorm", 32, 1024), ("rmsnorm", 256, 512)]
profile_each(norm_calls(CASES), warmup=5, repeats=int(os.environ.get("REPEATS", "1")))
