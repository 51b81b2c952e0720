# Stand-in for local testing only: the contract implemented in plain torch.
import torch, torch.nn.functional as F
def build_info(): return {"cuda": False, "cuda_archs": "", "version": "0.0-fake"}
def _put(res, out):
    if out is None: return res
    out.copy_(res); return out
def scale(x, factor, out=None, *, backend="auto", skip_check=False):
    return _put((x.float() * factor).to(x.dtype), out)
def _rms(s, w, eps, off): return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (w.float() + off)
def rmsnorm(input, weight, eps=1e-6, out=None, *, backend="auto", skip_check=False):
    return _put(_rms(input.float(), weight, eps, 0.0).to(input.dtype), out)
def gemma_rmsnorm(input, weight, eps=1e-6, out=None, *, backend="auto", skip_check=False):
    return _put(_rms(input.float(), weight, eps, 1.0).to(input.dtype), out)
def _fa(input, residual, weight, eps, out, residual_out, off):
    s = input.float() + residual.float()
    o = _rms(s, weight, eps, off).to(input.dtype)
    return _put(o, out), _put(s.to(input.dtype), residual_out)
def fused_add_rmsnorm(input, residual, weight, eps=1e-6, out=None, residual_out=None, *, backend="auto", skip_check=False):
    return _fa(input, residual, weight, eps, out, residual_out, 0.0)
def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, out=None, residual_out=None, *, backend="auto", skip_check=False):
    return _fa(input, residual, weight, eps, out, residual_out, 1.0)
def _act(f):
    def op(input, out=None, *, backend="auto", skip_check=False):
        d = input.shape[-1] // 2; x = input.float()
        return _put((f(x[..., :d]) * x[..., d:]).to(input.dtype), out)
    return op
silu_and_mul = _act(F.silu); gelu_and_mul = _act(F.gelu); gelu_tanh_and_mul = _act(lambda a: F.gelu(a, approximate="tanh"))
