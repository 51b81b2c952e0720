"""Compiled solutions on CPU: cpp through torch's extension loader (pybind11 module or torch
library op) and through TVM-FFI, cuda through TVM-FFI (compiled, not run, without a GPU).

The two builds with torch headers take about 10 s each; they run once per module, side by
side: two child processes race to build the pybind11 solution into one cache while this
process builds the torch-op solution.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opforge.registry import COMPILE_ERROR, ENTRY_POINT_ERROR, IMPORT_ERROR, UNSUPPORTED, BuildError, build
from registry_helpers import (  # noqa: F401 (cache is a fixture)
    CACHE_VAR, CPP_PYBIND_MUL, CPP_TORCH_OP_MUL, TVM_FFI_CPP_MUL, TVM_FFI_CUDA_MUL, c_api_source, cache,
    mul_definition, solution)

X = torch.randn(4, 8)
W = torch.randn(8)


def pybind_mul():
    return solution("cpp_pybind", CPP_PYBIND_MUL, entry="kernel.cpp::run", language="cpp")


def torch_op_mul():
    return solution("cpp_torch_op", CPP_TORCH_OP_MUL, entry="kernel.cpp::torch.ops.opforge_test_mul.run",
                    language="cpp", dps=True)


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {helpers!r})
    import torch
    from opforge.registry import build
    from registry_helpers import mul_definition
    from test_native_builder import pybind_mul
    run = build(pybind_mul(), mul_definition(), "cpu")
    x, w = torch.randn(3, 8), torch.randn(8)
    print(json.dumps({{"hit": run.cache_hit, "ok": bool(torch.equal(run(x, w), x * w))}}))
""")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """The build cache of the slow builds, shared by this module's tests."""
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture
def use_shared_cache(shared_cache, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(shared_cache))


@pytest.fixture(scope="module")
def native_builds(shared_cache):
    env = {**os.environ, CACHE_VAR: str(shared_cache)}
    code = _CHILD.format(helpers=str(Path(__file__).parent))
    children = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    old = os.environ.get(CACHE_VAR)
    os.environ[CACHE_VAR] = str(shared_cache)
    try:
        torch_op = build(torch_op_mul(), mul_definition(), "cpu")
    finally:
        if old is None:
            del os.environ[CACHE_VAR]
        else:
            os.environ[CACHE_VAR] = old
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"children": results, "torch_op": torch_op}


def test_concurrent_builds_compile_once(native_builds, shared_cache):
    results = native_builds["children"]
    assert all(r["ok"] for r in results)
    assert sorted(r["hit"] for r in results) == [False, True]
    assert len([p for p in (shared_cache / "cpp").iterdir() if p.is_dir()]) == 2  # pybind + torch op


def test_cached_build_does_not_compile(native_builds, use_shared_cache, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled although the build is cached")

    monkeypatch.setattr(cpp_extension, "load", no_compiling)
    run = build(pybind_mul(), mul_definition(), "cpu")
    assert run.cache_hit is True and run.artifact.is_file()
    assert not run.by_name  # pybind11's docstring says run(x, w): the Definition's order
    torch.testing.assert_close(run(X, W), X * W)
    torch.testing.assert_close(run(w=W, x=X), X * W)


def test_torch_library_op_destination_passing(native_builds):
    run = native_builds["torch_op"]
    assert run.destination_passing_style and run.by_name  # names from the op's schema
    assert run.fn is torch.ops.opforge_test_mul.run
    torch.testing.assert_close(run(X, W), X * W)
    y = torch.empty(4, 8)
    run.call_into(X, W, y)
    torch.testing.assert_close(y, X * W)


_EDITED_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {helpers!r})
    import torch
    from opforge.registry import BuildError, build
    from registry_helpers import CPP_TORCH_OP_MUL, mul_definition, solution
    from test_native_builder import torch_op_mul
    first = build(torch_op_mul(), mul_definition(), "cpu")
    edited = solution("cpp_torch_op", CPP_TORCH_OP_MUL.replace("mul_out(y, x, w)", "mul_out(y, w, x)"),
                      entry="kernel.cpp::torch.ops.opforge_test_mul.run", language="cpp", dps=True)
    try:
        build(edited, mul_definition(), "cpu")
        error = None
    except BuildError as exc:
        error = {{"kind": exc.kind, "message": str(exc)}}
    x, w = torch.randn(3, 8), torch.randn(8)
    print(json.dumps({{"first_hit": first.cache_hit, "first_ok": bool(torch.equal(first(x, w), x * w)),
                      "error": error}}))
""")


def test_edited_torch_library_is_refused_in_the_same_process(native_builds, shared_cache):
    # torch aborts the process (SIGABRT) when a second library registers a TORCH_LIBRARY
    # namespace: the edited build must be refused before it is loaded, hence the child process.
    code = _EDITED_CHILD.format(helpers=str(Path(__file__).parent))
    child = subprocess.run([sys.executable, "-c", code], env={**os.environ, CACHE_VAR: str(shared_cache)},
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, f"exit status {child.returncode}\n{child.stderr[-3000:]}"
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["first_hit"] and result["first_ok"]
    error = result["error"]
    assert error is not None and error["kind"] == IMPORT_ERROR
    assert "namespace 'opforge_test_mul'" in error["message"]
    assert "already registered in this process" in error["message"] and "new process" in error["message"]
    assert len([p for p in (shared_cache / "cpp").iterdir() if p.is_dir()]) == 2  # refused before compiling


def test_torch_library_namespaces_from_sources():
    from opforge.registry.builders.native import torch_library_namespaces

    sources = {"a.cpp": "TORCH_LIBRARY(ns_a, m) {}\nTORCH_LIBRARY_IMPL(ns_a, CPU, m) {}\n",
               "b.h": "TORCH_LIBRARY_FRAGMENT( ns_b , m) {}\nTORCH_LIBRARY_IMPL(ns_c, CPU, m) {}\n",
               "c.cpp": "TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {}\n"}
    sol = solution("ns", sources, entry="a.cpp::run", language="cpp")
    assert torch_library_namespaces(sol, "opforge_cpp_0123") == {"ns_a", "ns_b", "opforge_cpp_0123"}


def test_compile_error_carries_compiler_message(cache):
    src = "#include <vector>\nint run(int x) { return x +; }\n"
    with pytest.raises(BuildError) as info:
        build(solution("broken", src, entry="kernel.cpp::run", language="cpp"), mul_definition(), "cpu")
    err = info.value
    assert err.kind == COMPILE_ERROR
    message = str(err)
    assert message.startswith("solution 'broken': compilation failed:\nkernel.cpp:2:")
    assert "error: expected primary-expression" in message
    assert "return x +; }" in message  # the source line gcc quotes
    assert "-isystem" not in message and "ninja" not in message and "Traceback" not in message
    assert str(cache) not in message
    assert "-isystem" in err.log  # the full output stays available
    assert not any(p.is_dir() for p in (cache / "cpp").iterdir())  # a failed build leaves nothing behind


def test_c_api_module_with_doc_signature(cache):
    run = build(solution("capi", c_api_source(), entry="kernel.cpp::run", language="cpp"), mul_definition(), "cpu")
    assert not run.by_name and run.cache_hit is False
    torch.testing.assert_close(run(X, W), X * W)


def test_compiled_module_without_the_symbol(cache):
    sol = solution("capi_other", c_api_source(symbol="other"), entry="kernel.cpp::run", language="cpp")
    with pytest.raises(BuildError, match=r"exports no 'run' \(it exports: other\)") as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR


def test_library_that_fails_to_load(cache):
    body = ('extern "C" int opforge_missing_function();\n'
            "static PyObject* run(PyObject*, PyObject*) { return PyLong_FromLong(opforge_missing_function()); }\n")
    sol = solution("capi_undefined", c_api_source(body), entry="kernel.cpp::run", language="cpp")
    with pytest.raises(BuildError, match="undefined symbol: opforge_missing_function") as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == IMPORT_ERROR


def test_torch_op_that_is_not_registered(cache):
    sol = solution("capi_no_op", c_api_source(), entry="kernel.cpp::torch.ops.opforge_test_none.run",
                   language="cpp", dps=True)
    with pytest.raises(BuildError, match="registers no torch op opforge_test_none::run") as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR


@pytest.mark.parametrize("sources, entry, match", [
    ({"kernel.py": "def run(x, w):\n    return x\n"}, "kernel.py::run", "names a C\\+\\+ or CUDA source"),
    ({"kernel.cpp": "", "k.cu": ""}, "kernel.cpp::run", "language cpp cannot compile CUDA sources"),
])
def test_cpp_source_errors(cache, sources, entry, match):
    with pytest.raises(BuildError, match=match):
        build(solution("cpp_bad", sources, entry=entry, language="cpp"), mul_definition(), "cpu")


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch has CUDA: the torch binding can compile .cu")
def test_cuda_torch_binding_needs_cuda_torch(cache):
    sol = solution("cu_torch", {"k.cu": "__global__ void k() {}\n"}, entry="k.cu::run", language="cuda",
                   target=("any",))
    with pytest.raises(BuildError, match="needs a CUDA build of torch") as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED


# --- TVM-FFI ------------------------------------------------------------------------------------


@pytest.fixture
def tvm_ffi(cache):
    return pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")


def test_tvm_ffi_cpp_destination_passing(tvm_ffi):
    sol = solution("tvm_cpp", TVM_FFI_CPP_MUL, entry="kernel.cpp::run", language="cpp", dps=True, binding="tvm-ffi")
    run = build(sol, mul_definition(), "cpu")
    torch.testing.assert_close(run(X, W), X * W)
    with pytest.raises(Exception, match="x must be 2-D"):
        run.call_into(torch.ones(8), W, torch.empty(8))
    assert build(sol, mul_definition(), "cpu").cache_hit is True


def test_a_solution_without_a_binding_is_built_with_tvm_ffi(tvm_ffi):
    """As FlashInfer-Bench reads it (its example CUDA solutions carry no binding field): the
    TVM-FFI source builds and runs; the same source with binding "torch" does not compile as a
    torch extension."""
    unset = solution("tvm_unset", TVM_FFI_CPP_MUL, entry="kernel.cpp::run", language="cpp", dps=True, binding=None)
    assert unset.spec.binding is None and "binding" in unset.to_dict()["spec"]
    run = build(unset, mul_definition(), "cpu")
    torch.testing.assert_close(run(X, W), X * W)
    as_torch = solution("tvm_as_torch", TVM_FFI_CPP_MUL, entry="kernel.cpp::run", language="cpp", dps=True,
                        binding="torch")
    with pytest.raises(BuildError) as info:
        build(as_torch, mul_definition(), "cpu")
    assert info.value.kind in (COMPILE_ERROR, ENTRY_POINT_ERROR)


def test_tvm_ffi_missing_symbol_and_compile_error(tvm_ffi):
    sol = solution("tvm_nosym", TVM_FFI_CPP_MUL.replace("EXPORT_TYPED_FUNC(run", "EXPORT_TYPED_FUNC(other"),
                   entry="kernel.cpp::run", language="cpp", dps=True, binding="tvm-ffi")
    with pytest.raises(BuildError, match="exports no function 'run'") as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == ENTRY_POINT_ERROR
    broken = solution("tvm_broken", "int run( {\n", entry="kernel.cpp::run", language="cpp", binding="tvm-ffi")
    with pytest.raises(BuildError, match=r"kernel.cpp:1:\d+: error") as info:
        build(broken, mul_definition(), "cpu")
    assert info.value.kind == COMPILE_ERROR


def test_tvm_ffi_not_installed(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    sol = solution("tvm_missing", "", entry="kernel.cpp::run", language="cpp", binding="tvm-ffi")
    with pytest.raises(BuildError, match=r"binding 'tvm-ffi' needs apache-tvm-ffi") as info:
        build(sol, mul_definition(), "cpu")
    assert info.value.kind == UNSUPPORTED


def test_cuda_solution_compiles(tvm_ffi, monkeypatch):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    # tvm_ffi takes the toolkit to be nvcc's parent folder unless CUDA_HOME says otherwise; nvcc
    # may be a wrapper script outside the toolkit (as /usr/local/bin/nvcc is on some machines).
    if not os.environ.get("CUDA_HOME"):
        home = Path(os.path.realpath(nvcc)).parents[1]
        if not list(home.glob("lib*/libcudart.so*")) and Path("/usr/local/cuda").is_dir():
            home = Path("/usr/local/cuda")
        monkeypatch.setenv("CUDA_HOME", str(home))
    if not torch.cuda.is_available():
        monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
    sol = solution("tvm_cuda", {"kernel.cu": TVM_FFI_CUDA_MUL}, entry="kernel.cu::run", language="cuda", dps=True,
                   binding="tvm-ffi", target=("cuda",))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # no GPU: check the build alone, bypassing the hardware check
        sol = sol.model_copy(update={"spec": sol.spec.model_copy(update={"target_hardware": ["any"]})})
    run = build(sol, mul_definition(), device)
    assert run.artifact.is_file() and run.destination_passing_style
    if device == "cuda":
        x, w = X.to(device), W.to(device)
        torch.testing.assert_close(run(x, w), x * w)


CUDA_TORCH_MUL = {
    "kernel.cu": """
        #include <torch/extension.h>

        __global__ void mul_rows(const float* x, const float* w, float* out, long rows, long cols) {
          long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
          if (i < rows * cols) out[i] = x[i] * w[i % cols];
        }

        torch::Tensor run(torch::Tensor x, torch::Tensor w) {
          auto out = torch::empty_like(x);
          const long n = x.numel();
          mul_rows<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(),
                                             x.size(0), x.size(1));
          return out;
        }

        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
    """,
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_solution_through_the_torch_binding_runs(cache):
    sol = solution("cu_torch_mul", CUDA_TORCH_MUL, entry="kernel.cu::run", language="cuda", target=("cuda",))
    run = build(sol, mul_definition(), "cuda")
    x, w = torch.randn(5, 8, device="cuda"), torch.randn(8, device="cuda")
    torch.testing.assert_close(run(x, w), x * w)
    assert build(sol, mul_definition(), "cuda").cache_hit  # the second build compiles nothing
