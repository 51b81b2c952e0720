# One call of each decode-size op and its best peer, for Nsight Compute:
#   ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel \
#       --section LaunchStats --section SpeedOfLight --section WarpStateStats --section InstructionStats \
#       python3 profile_decode.py
# (needs liger-kernel; times under ncu are with caches flushed, so they are not graph-replay times)
import torch, opforge
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.swiglu import swiglu_fused_gate_up_forward
dev = "cuda"
x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
r = torch.randn_like(x); w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
o = torch.empty_like(x); ro = torch.empty_like(x)
g = torch.randn(1, 2 * 14336, device=dev, dtype=torch.bfloat16)
go = torch.empty(1, 14336, device=dev, dtype=torch.bfloat16)
comp = torch.compile(lambda t: torch.nn.functional.silu(t[..., :14336]) * t[..., 14336:])
calls = {
 "opforge rmsnorm": lambda: opforge.rmsnorm(x, w, 1e-6, out=o),
 "liger rmsnorm": lambda: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama"),
 "opforge fused_add": lambda: opforge.fused_add_rmsnorm(x, r, w, 1e-6, out=o, residual_out=ro),
 "liger fused_add": lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-6, 0.0, "llama"),
 "opforge silu_and_mul": lambda: opforge.silu_and_mul(g, out=go),
 "compiled silu_and_mul": lambda: comp(g),
}
for f in calls.values():
    for _ in range(5): f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name, f in calls.items():
    torch.cuda.nvtx.range_push(name); f(); torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done")
