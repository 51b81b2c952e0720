"""CUDA_ARCH_LIST parsing (cmake/CudaArchList.cmake), run through CMake's script mode."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[1] / "cmake" / "CudaArchList.cmake"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not on PATH")


@functools.lru_cache(maxsize=None)
def cmake_binary() -> str:
    """The cmake executable itself, as CMake names it (CMAKE_COMMAND): `cmake` on PATH may be a
    wrapper script (pyenv shims, the cmake wheel's entry point) that needs PATH to find it, and
    the test below runs cmake with PATH emptied."""
    proc = subprocess.run([shutil.which("cmake"), "-P", "/dev/stdin"], input='message(STATUS "${CMAKE_COMMAND}")\n',
                          capture_output=True, text=True, check=True)
    line = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    return line.removeprefix("-- ").strip()


def parse(value: str | None, tmp_path: Path, path_env: str | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "parse.cmake"
    script.write_text(
        f'include("{MODULE.as_posix()}")\n'
        "opforge_parse_cuda_arch_list()\n"
        'message(STATUS "RESULT ${OPFORGE_CUDA_ARCHS_WANTED}|${OPFORGE_CUDA_ARCHITECTURES}|${OPFORGE_ARCH_NAMES}")\n'
    )
    env = dict(os.environ)
    env.pop("CUDA_ARCH_LIST", None)
    if value is not None:
        env["CUDA_ARCH_LIST"] = value
    if path_env is not None:
        env["PATH"] = path_env
    return subprocess.run([cmake_binary(), "-P", str(script)], env=env, capture_output=True, text=True)


def result(proc: subprocess.CompletedProcess) -> tuple[str, list[str], list[str]]:
    assert proc.returncode == 0, proc.stderr + proc.stdout
    line = next(l for l in (proc.stdout + proc.stderr).splitlines() if "RESULT " in l)
    wanted, archs, names = line.split("RESULT ", 1)[1].split("|")
    return wanted, [a for a in archs.split(";") if a], [n for n in names.split(";") if n]


@pytest.mark.parametrize(
    "value, archs, names",
    [
        ("8.0;9.0a", ["80-real", "90a-real"], ["8.0", "9.0a"]),
        ("80;90a", ["80-real", "90a-real"], ["8.0", "9.0a"]),
        ("8.0 9.0a", ["80-real", "90a-real"], ["8.0", "9.0a"]),
        ("8.0,9.0a", ["80-real", "90a-real"], ["8.0", "9.0a"]),
        ("9.0a+PTX", ["90a"], ["9.0a+PTX"]),
        ("8.0+ptx", ["80"], ["8.0+PTX"]),
        ("10.0a;12.0", ["100a-real", "120-real"], ["10.0a", "12.0"]),
        ("  9.0a  ", ["90a-real"], ["9.0a"]),
        ("9.0a;9.0a", ["90a-real"], ["9.0a"]),
    ],
)
def test_accepted_forms(value, archs, names, tmp_path):
    wanted, got_archs, got_names = result(parse(value, tmp_path))
    assert wanted == "TRUE"
    assert got_archs == archs
    assert got_names == names


def test_unset_uses_the_default(tmp_path):
    wanted, archs, _ = result(parse(None, tmp_path))
    assert wanted == "TRUE" and archs == ["80-real", "90a-real"]


@pytest.mark.parametrize("value", ["none", "NONE", " none "])
def test_none_is_cpu_only(value, tmp_path):
    wanted, archs, _ = result(parse(value, tmp_path))
    assert wanted == "FALSE" and archs == []


@pytest.mark.parametrize(
    "value, words",
    [("abc", "cannot read 'abc'"), ("9.0b", "cannot read"), ("7.0", "older than"), (";;", "names no architecture")],
)
def test_bad_values_are_refused_with_a_reason(value, words, tmp_path):
    proc = parse(value, tmp_path)
    assert proc.returncode != 0
    assert words in proc.stderr


def _gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi") or ("/usr/bin/nvidia-smi" if Path("/usr/bin/nvidia-smi").exists() else None)
    if smi is None:
        return False
    proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.strip() != ""


@pytest.mark.skipif(_gpu_visible(), reason="a GPU is visible, so 'native' is legitimately accepted")
def test_native_without_a_gpu_is_refused(tmp_path):
    # An empty PATH also hides nvidia-smi from the search, as on a build machine without a GPU.
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = parse("native", tmp_path, path_env=str(empty))
    assert proc.returncode != 0
    assert "needs a GPU visible at build time" in proc.stderr
