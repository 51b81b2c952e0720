"""Compiled languages: cpp and cuda, through TVM-FFI (binding "tvm-ffi", which a solution without
a binding gets, as in FlashInfer-Bench; needs apache-tvm-ffi) or through torch's C++ extension
loader (binding "torch").

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

torch registers a TORCH_LIBRARY namespace once per process and aborts the process (SIGABRT, from
the library's static initializer) when a second library registers it again, e.g. an edited
build of the same solution. So each process records which library registered which namespace
(read from the sources), and a build whose library would register a namespace again is refused
with a BuildError of kind IMPORT_ERROR before it is compiled or loaded; it needs a new process.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import threading
from pathlib import Path

from ..cache import ARTIFACT, cached_build, entry_folder, solution_key, toolchain_identity
from ..errors import COMPILE_ERROR, ENTRY_POINT_ERROR, IMPORT_ERROR, UNSUPPORTED, BuildError, trim_compiler_output
from . import Loaded

CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
CUDA_SUFFIXES = (".cu",)
TORCH_OPS = "torch.ops."

# Fragments count too: a fragment that defines an op already defined aborts the same way. A
# commented-out block matches as well: a needless refusal is better than an aborted process.
_TORCH_LIBRARY = re.compile(r"\bTORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,")
# namespace -> (resolved path of the library that registered it, that solution's name). A
# namespace is process-wide, hence so is this record.
_NAMESPACES: dict[str, tuple[str, str]] = {}
_NAMESPACES_LOCK = threading.Lock()


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


def torch_library_namespaces(solution, extension_name: str) -> set[str]:
    """The namespaces the solution's TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT blocks register;
    TORCH_EXTENSION_NAME stands for ``extension_name``, which differs between builds."""
    found = {ns for s in solution.sources for ns in _TORCH_LIBRARY.findall(s.content)}
    return {extension_name if ns == "TORCH_EXTENSION_NAME" else ns for ns in found}


def _claim_namespaces(solution, namespaces: set[str], library: Path) -> set[str]:
    """Record ``library`` as the registrant of ``namespaces``; the ones newly recorded. Raises
    when another library registered one of them in this process: loading would abort it."""
    library_id = str(library.resolve())
    with _NAMESPACES_LOCK:
        for ns in sorted(namespaces):
            owner_path, owner = _NAMESPACES.get(ns, (library_id, ""))
            if owner_path != library_id:
                raise BuildError(IMPORT_ERROR, solution.name,
                                 f"its sources register the torch op namespace {ns!r} (TORCH_LIBRARY), which was "
                                 f"already registered in this process by another build of solution {owner!r} "
                                 f"({owner_path}); torch registers a namespace once per process and aborts the "
                                 f"process on a second one, so load this build in a new process (e.g. one of the "
                                 f"benchmark runner's workers)")
        claimed = namespaces - _NAMESPACES.keys()
        _NAMESPACES.update({ns: (library_id, solution.name) for ns in claimed})
    return claimed


def load_torch(solution, language: str, entry_file: str, symbol: str, device) -> Loaded:
    import torch
    from torch.utils.cpp_extension import JIT_EXTENSION_VERSIONER
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
        # torch remembers each name it compiled in this process and then skips the compile (same
        # sources and folder: a damaged entry being rebuilt) or renames the library <name>_v1 (a
        # second cache root). The cache decides when to build; this folder always needs compiling.
        JIT_EXTENSION_VERSIONER.entries.pop(name, None)
        try:
            torch_load(name=name, sources=[str(folder / p) for p in cpp + cuda], extra_include_paths=[str(folder)],
                       build_directory=str(folder), with_cuda=with_cuda, is_python_module=not torch_op,
                       verbose=False)
        except ImportError as exc:  # compiled, but the library does not load
            raise BuildError(IMPORT_ERROR, solution.name, f"loading the compiled module failed: {exc}") from None
        except Exception as exc:
            raise _compile_error(solution, exc, folder) from None
        return {ARTIFACT: f"{name}.so"}

    # Both the build (torch_load loads what it compiled) and a cache hit load the library.
    claimed = _claim_namespaces(solution, torch_library_namespaces(solution, name),
                                entry_folder(language, solution, key) / f"{name}.so")
    try:
        entry = cached_build(language, solution, key, produce)
        artifact = entry.path / entry.info[ARTIFACT]
        if torch_op:
            try:
                torch.ops.load_library(str(artifact))
            except OSError as exc:
                raise BuildError(IMPORT_ERROR, solution.name, f"loading the compiled library failed: {exc}") from None
        else:
            module = _import_extension(solution, name, artifact)
    except BaseException:
        # A library that did not load registered nothing: its namespaces stay free.
        with _NAMESPACES_LOCK:
            for ns in claimed:
                del _NAMESPACES[ns]
        raise
    if torch_op:
        fn = getattr(getattr(torch.ops, namespace), op, None)
        try:
            fn.default  # an op packet resolves its overloads lazily: this fails for unknown ops
        except (AttributeError, RuntimeError):
            raise BuildError(ENTRY_POINT_ERROR, solution.name,
                             f"the compiled library registers no torch op {namespace}::{op}") from None
    else:
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
        return {ARTIFACT: str(Path(path).relative_to(folder))}

    entry = cached_build(f"{language}-tvm-ffi", solution, key, produce)
    artifact = entry.path / entry.info[ARTIFACT]
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
