"""Compiled languages: cpp and cuda, through torch's C++ extension loader (binding "torch", the
default) or through TVM-FFI (binding "tvm-ffi", when apache-tvm-ffi is installed).

binding "torch": the sources are compiled with ``torch.utils.cpp_extension.load`` into the
build cache (``with_cuda`` for language cuda). The entry symbol is either

* a function of a pybind11 module: ``kernel.cpp::run`` with
  ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }``, or
* a torch library op: ``kernel.cpp::torch.ops.myns.run`` with
  ``TORCH_LIBRARY(myns, m) { m.def("run", &run); }`` (no Python module; ``torch/library.h`` is
  the only torch header it needs, which compiles several times faster than
  ``torch/extension.h``).

binding "tvm-ffi": ``tvm_ffi.cpp.build`` compiles the sources and ``tvm_ffi.load_module`` loads
the library; the entry symbol is a function exported with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC``, so
FlashInfer-Bench CUDA solutions run unchanged (they are destination-passing).

The cache key covers the sources, the spec, and Python / torch / compiler versions; a compile
failure is a BuildError of kind COMPILE_ERROR whose message keeps the compiler's error lines.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from ..cache import cached_build, solution_key, toolchain_identity
from ..errors import COMPILE_ERROR, ENTRY_POINT_ERROR, IMPORT_ERROR, UNSUPPORTED, BuildError, trim_compiler_output
from . import Loaded

CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
CUDA_SUFFIXES = (".cu",)
TORCH_OPS = "torch.ops."


def _compile_sources(solution, language: str, entry_file: str) -> tuple[list[str], list[str]]:
    """(C++ source paths, CUDA source paths) of the solution; headers are only included."""
    if not entry_file.endswith(CPP_SUFFIXES + CUDA_SUFFIXES):
        raise BuildError(ENTRY_POINT_ERROR, solution.name,
                         f"a {language} entry point names a C++ or CUDA source ({', '.join(CPP_SUFFIXES + CUDA_SUFFIXES)}); "
                         f"got {entry_file!r}")
    cpp = [s.path for s in solution.sources if s.path.endswith(CPP_SUFFIXES)]
    cuda = [s.path for s in solution.sources if s.path.endswith(CUDA_SUFFIXES)]
    if cuda and language != "cuda":
        raise BuildError(UNSUPPORTED, solution.name,
                         f"language {language} cannot compile CUDA sources ({', '.join(cuda)}); use language cuda")
    return cpp, cuda


def _need_nvcc(solution) -> None:
    if shutil.which("nvcc") is None:
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME is None:
            raise BuildError(UNSUPPORTED, solution.name, "language cuda needs nvcc (the CUDA toolkit); none found")


def _need_torch_cuda(solution) -> None:
    """Binding torch compiles CUDA against torch's CUDA libraries: a CUDA build of torch."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None or CUDA_HOME is None:
        why = f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None else "no CUDA toolkit found"
        raise BuildError(UNSUPPORTED, solution.name, f"language cuda with binding torch needs a CUDA build of torch "
                                                     f"and the CUDA toolkit; {why} (binding tvm-ffi needs neither)")


def _compile_error(solution, exc: Exception, folder: Path) -> BuildError:
    log = str(exc)
    return BuildError(COMPILE_ERROR, solution.name,
                      "compilation failed:\n" + trim_compiler_output(log, str(folder)), log=log)


def _import_extension(solution, name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as exc:
        raise BuildError(IMPORT_ERROR, solution.name, f"loading the compiled module failed: {exc}") from None
    sys.modules[name] = module
    return module


def load_torch(solution, language: str, entry_file: str, symbol: str, device) -> Loaded:
    from torch.utils.cpp_extension import load as torch_load

    cpp, cuda = _compile_sources(solution, language, entry_file)
    with_cuda = language == "cuda"
    if with_cuda:
        _need_torch_cuda(solution)
    torch_op = symbol.startswith(TORCH_OPS)
    namespace, _, op = symbol[len(TORCH_OPS):].rpartition(".") if torch_op else ("", "", symbol)
    if torch_op and (not namespace or "." in namespace):
        raise BuildError(ENTRY_POINT_ERROR, solution.name,
                         f"a torch op entry symbol reads torch.ops.<namespace>.<op>; got {symbol!r}")
    key = solution_key(solution, toolchain_identity(with_cuda, device))
    name = f"opforge_{language}_{key[:16]}"

    def produce(folder: Path) -> dict:
        try:
            torch_load(name=name, sources=[str(folder / p) for p in cpp + cuda], extra_include_paths=[str(folder)],
                       build_directory=str(folder), with_cuda=with_cuda, is_python_module=not torch_op,
                       verbose=False)
        except ImportError as exc:  # compiled, but the library does not load
            raise BuildError(IMPORT_ERROR, solution.name, f"loading the compiled module failed: {exc}") from None
        except Exception as exc:
            raise _compile_error(solution, exc, folder) from None
        return {"artifact": f"{name}.so"}

    entry = cached_build(language, solution, key, produce)
    artifact = entry.path / entry.info["artifact"]
    if torch_op:
        import torch

        try:
            torch.ops.load_library(str(artifact))
        except OSError as exc:
            raise BuildError(IMPORT_ERROR, solution.name, f"loading the compiled library failed: {exc}") from None
        fn = getattr(getattr(torch.ops, namespace), op, None)
        try:
            fn.default  # an op packet resolves its overloads lazily: this fails for unknown ops
        except (AttributeError, RuntimeError):
            raise BuildError(ENTRY_POINT_ERROR, solution.name,
                             f"the compiled library registers no torch op {namespace}::{op}") from None
    else:
        module = _import_extension(solution, name, artifact)
        fn = module
        for part in op.split("."):
            fn = getattr(fn, part, None)
        if fn is None:
            exported = sorted(n for n in dir(module) if not n.startswith("_"))
            raise BuildError(ENTRY_POINT_ERROR, solution.name,
                             f"the compiled module exports no {op!r} (it exports: {', '.join(exported) or 'nothing'})")
    return Loaded(fn, cache_hit=entry.hit, build_dir=entry.path, artifact=artifact)


def load_tvm_ffi(solution, language: str, entry_file: str, symbol: str, device) -> Loaded:
    try:
        import tvm_ffi
        import tvm_ffi.cpp
    except ImportError:
        raise BuildError(UNSUPPORTED, solution.name,
                         "binding 'tvm-ffi' needs apache-tvm-ffi (pip install apache-tvm-ffi)") from None
    cpp, cuda = _compile_sources(solution, language, entry_file)
    if cuda:
        _need_nvcc(solution)
    ident = toolchain_identity(bool(cuda), device) + [f"tvm_ffi {tvm_ffi.__version__}"]
    key = solution_key(solution, ident)
    name = f"opforge_tvmffi_{language}_{key[:16]}"

    def produce(folder: Path) -> dict:
        try:
            path = tvm_ffi.cpp.build(name=name, cpp_files=[str(folder / p) for p in cpp],
                                     cuda_files=[str(folder / p) for p in cuda],
                                     extra_include_paths=[str(folder)], build_directory=str(folder))
        except Exception as exc:
            raise _compile_error(solution, exc, folder) from None
        return {"artifact": str(Path(path).relative_to(folder))}

    entry = cached_build(f"{language}-tvm-ffi", solution, key, produce)
    artifact = entry.path / entry.info["artifact"]
    try:
        module = tvm_ffi.load_module(str(artifact))
    except Exception as exc:
        raise BuildError(IMPORT_ERROR, solution.name, f"loading the compiled library failed: {exc}") from None
    try:
        fn = getattr(module, symbol)
    except AttributeError:
        raise BuildError(ENTRY_POINT_ERROR, solution.name,
                         f"the compiled library exports no function {symbol!r} "
                         f"(export it with TVM_FFI_DLL_EXPORT_TYPED_FUNC)") from None
    return Loaded(fn, cache_hit=entry.hit, build_dir=entry.path, artifact=artifact)
