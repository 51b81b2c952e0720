"""enable_pdl: programmatic dependent launch for the norms and the activations.

On a GPU of compute capability 9.0+ the kernels may then start while the previous kernel on the
stream finishes (they wait on the device before reading anything), so results must be bitwise
those of a plain launch, in eager calls, in chains of dependent calls and under CUDA-graph
capture. Everywhere else enable_pdl=True is refused with a clear error, and only True or False
are accepted.
"""

from __future__ import annotations

import pytest
import torch

import opforge
from conftest import capture_graph, replay

NORMS = ["rmsnorm", "gemma_rmsnorm"]
ADD_NORMS = ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm"]
ACTS = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]


def _call(name, x, w, **kwargs):
    op = getattr(opforge, name)
    if name in NORMS:
        return op(x, w, 1e-6, **kwargs)
    if name in ADD_NORMS:
        return op(x, x.flip(0).contiguous(), w, 1e-6, **kwargs)
    return op(x, **kwargs)


@pytest.mark.parametrize("name", NORMS + ADD_NORMS + ACTS)
def test_pdl_on_cpu_tensors_is_refused(name):
    x, w = torch.randn(3, 16), torch.randn(16)
    for path in ({}, {"skip_check": True}, {"backend": "cpu"}, {"backend": "torch"}):
        with pytest.raises(ValueError, match=rf"^opforge\.{name}: enable_pdl=True needs CUDA tensors"):
            _call(name, x, w, enable_pdl=True, **path)
    _call(name, x, w, enable_pdl=False)  # the default, said explicitly


@pytest.mark.parametrize("name", NORMS + ADD_NORMS + ACTS)
@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_enable_pdl_takes_a_bool(name, value):
    x, w = torch.randn(3, 16), torch.randn(16)
    with pytest.raises(TypeError, match=rf"^opforge\.{name}: enable_pdl must be True or False, got "):
        _call(name, x, w, enable_pdl=value)


def test_launches_with_pdl_answers_without_a_usable_gpu():
    """The query behind enable_pdl's fallback answers for any device index, with no GPU, in a
    build without CUDA, or for a device that does not exist: no PDL there, and no error left
    behind for the next launch to report."""
    from opforge import _C

    if torch.cuda.is_available() and opforge.build_info()["cuda"]:
        pytest.skip("a usable GPU is here: the GPU test below covers it")
    for device in (0, 3):
        assert _C.launches_with_pdl(device) == {"norm": False, "act_and_mul": False}


# --- CUDA ------------------------------------------------------------------------------------


def _pdl_gpu():
    if not torch.cuda.is_available() or not opforge.build_info()["cuda"]:
        return False
    return torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
def test_pdl_on_a_gpu_without_it_is_refused():
    major, minor = torch.cuda.get_device_capability()
    if major >= 9:
        pytest.skip("this GPU supports programmatic dependent launch")
    x, w = torch.randn(3, 16, device="cuda"), torch.randn(16, device="cuda")
    with pytest.raises(ValueError, match=rf"compute capability 9\.0 or newer .*; cuda:\d is {major}\.{minor}"):
        opforge.rmsnorm(x, w, enable_pdl=True)


@pytest.mark.gpu
def test_a_build_with_hopper_code_launches_with_pdl():
    """enable_pdl=True launches with PDL only where the code loaded for the GPU waits for the
    previous kernel (code generated for 9.0+; PTX of an older arch JIT-compiled for the GPU has no
    wait, and is launched plainly). A build holding 9.0 code must use it on such a GPU."""
    if not _pdl_gpu():
        pytest.skip("needs a GPU of compute capability 9.0+")
    from opforge import _C
    from opforge._ext import _arch_runs_on, compute_capability

    device = torch.cuda.current_device()
    cc = compute_capability(device)
    archs = opforge.build_info()["cuda_archs"]
    # The driver prefers compiled code for the GPU (SASS, the arch without "+PTX") to PTX.
    sass = [a.removesuffix("+PTX") for a in archs if _arch_runs_on(a.removesuffix("+PTX"), cc)]
    if not any(int(a.split(".")[0]) >= 9 for a in sass):
        pytest.skip(f"this build has no compiled 9.0+ code for compute capability {cc} ({archs})")
    assert _C.launches_with_pdl(device) == {"norm": True, "act_and_mul": True}


@pytest.mark.gpu
@pytest.mark.parametrize("name", NORMS + ADD_NORMS + ACTS)
@pytest.mark.parametrize("rows, hidden", [(1, 4096), (7, 5120), (300, 2048)], ids=str)
def test_pdl_results_are_bitwise_a_plain_launch(seed, name, rows, hidden):
    if not _pdl_gpu():
        pytest.skip("needs a GPU of compute capability 9.0+")
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    w = torch.randn(hidden, device="cuda", generator=g).bfloat16()
    plain = _call(name, x, w)
    for kwargs in ({"enable_pdl": True}, {"enable_pdl": True, "skip_check": True}, {"enable_pdl": True,
                                                                                      "backend": "cuda"}):
        got = _call(name, x, w, **kwargs)
        for a, b in zip(got if isinstance(got, tuple) else (got,), plain if isinstance(plain, tuple) else (plain,)):
            assert torch.equal(a, b), f"{name} {kwargs} {replay(seed)}"


def _chain(x, r, w, h, a, layers: int, pdl: bool):
    """Back-to-back dependent calls, as in a decoder layer without its GEMMs: each norm reads
    the previous activation's output, each activation the norm's."""
    for _ in range(layers):
        opforge.fused_add_rmsnorm(x, r, w, 1e-6, out=h, residual_out=r, enable_pdl=pdl)
        opforge.silu_and_mul(h, out=a, enable_pdl=pdl)
        x = a.repeat(1, 2)  # a torch kernel between: PDL must also wait behind kernels that never release early
    return a, r


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64])
def test_pdl_chains_eager_and_in_a_cuda_graph(seed, rows):
    if not _pdl_gpu():
        pytest.skip("needs a GPU of compute capability 9.0+")
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = 4096
    x0 = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    r0 = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
    w = torch.randn(hidden, device="cuda", generator=g).bfloat16()
    outs = {}
    for pdl in (False, True):
        r = r0.clone()
        h = torch.full_like(x0, float("nan"))
        a = torch.full((rows, hidden // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
        outs[pdl] = tuple(t.clone() for t in _chain(x0, r, w, h, a, 6, pdl))
    for want, got in zip(outs[False], outs[True]):
        assert torch.equal(want, got), replay(seed)

    # Captured: the graph keeps the programmatic edges; every replay gives the eager results.
    r = r0.clone()
    h = torch.empty_like(x0)
    a = torch.empty(rows, hidden // 2, device="cuda", dtype=torch.bfloat16)

    def step():
        r.copy_(r0)
        return _chain(x0, r, w, h, a, 6, True)

    graph, captured = capture_graph(step)
    for _ in range(3):
        a.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for want, got in zip(outs[False], captured):
            assert torch.equal(want, got), replay(seed)
