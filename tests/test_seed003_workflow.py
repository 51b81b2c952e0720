"""The kernel-contest workflow users bring (kernels written as ``def kernel(data: input_t) ->
output_t``, one tuple in and the filled output out, registered with
``BACKENDS.register(name, kernel_fn, description, language)``, compared with
``smoke_test reference triton cute``), on opforge with only the import lines changed.

The seed's files are transcribed below with plain-PyTorch bodies (the Triton and CuTe launches
become torch calls), for a stand-in of the NVFP4 GEMV Definition with the same input and output
names: ``c = sum_k (a * scale_a) * (b * scale_b)`` in fp32; the permuted scales are a second
layout that the reference does not read, as in the NVFP4 Definitions. Workload seeds are drawn
fresh for every run.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opforge import cli
from opforge.registry import BACKENDS, Registry, load_solution_modules
from opforge.trace import (AxisConst, AxisVar, BuildSpec, Definition, Solution, SourceFile, TensorSpec, TraceSet,
                           Workload)

DEF = "scaled_gemv_m16_k64"
#: The same op under another name, without solutions.
UNSOLVED = "scaled_gemv_unsolved_m16_k64"
SHAPES = {"a": ["m", "k", "l"], "b": ["one", "k", "l"], "scale_a": ["m", "k", "l"], "scale_b": ["one", "k", "l"],
          "scale_a_permuted": ["l", "m", "k"], "scale_b_permuted": ["l", "one", "k"]}
L_VALUES = (1, 3)
REFERENCE = """
import torch

def run(a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted):
    return ((a * scale_a) * (b * scale_b)).sum(dim=1, keepdim=True)
"""


def gemv_definition(name: str = DEF) -> Definition:
    return Definition(
        name=name, op_type="scaled_gemv",
        axes={"m": AxisConst(value=16), "k": AxisConst(value=64), "one": AxisConst(value=1), "l": AxisVar()},
        inputs={name: TensorSpec(shape=shape, dtype="float32") for name, shape in SHAPES.items()},
        outputs={"c": TensorSpec(shape=["m", "one", "l"], dtype="float32")},
        # Summation order differs between the kernels and the reference (einsum, sum(out=)).
        tolerances={"c": {"atol": 1e-4, "rtol": 1e-4}}, reference=REFERENCE)


def random_inputs(l: int) -> list[torch.Tensor]:
    sizes = {"m": 16, "k": 64, "one": 1, "l": l}
    return [torch.randn([sizes[axis] for axis in shape]) for shape in SHAPES.values()]


# --- the seed's files, import lines changed ----------------------------------------------------

#: kernel_utils/task.py + kernel_utils/backends.py: the one file a project writes for opforge.
TASK = f"""
import torch
from opforge.registry import BACKENDS as ALL

input_t = tuple  # (a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted, c)
output_t = torch.Tensor

# Registrations land in opforge's registry, which `opforge smoke` and `opforge run` read.
BACKENDS = ALL.with_defaults(definition="{DEF}", destination_passing_style=True)
"""

#: The same, as a registry of its own (not seen by the commands; for scripts and tests).
TASK_OWN_REGISTRY = f"""
import torch
from opforge.registry import Registry

input_t = tuple
output_t = torch.Tensor
BACKENDS = Registry(definition="{DEF}", destination_passing_style=True)
"""

#: nvfp4_reference_kernel.py: the seed registers its reference as a backend too.
REFERENCE_KERNEL = '''
import torch
from kernel_task import input_t, output_t
from kernel_task import BACKENDS


def reference_kernel(data: input_t) -> output_t:
    a, b, scale_a, scale_b, scale_a_perm, scale_b_perm, c = data
    c.copy_(((a * scale_a) * (b * scale_b)).sum(dim=1, keepdim=True))
    return c

BACKENDS.register("reference", reference_kernel, "PyTorch reference", "pytorch")
'''

TRITON_KERNEL = '''
import torch
from kernel_task import input_t, output_t
from kernel_task import BACKENDS


def triton_kernel(data: input_t) -> output_t:
    """Wrapper that launches Triton kernel."""
    a, b, scale_a, scale_b, scale_a_perm, scale_b_perm, c = data
    M, K, L = a.shape

    torch.sum((a * scale_a) * (b * scale_b), dim=1, keepdim=True, out=c)

    return c

# Register automatically on import
BACKENDS.register(
    name="triton",
    kernel_fn=triton_kernel,
    description="Triton FP4 GEMV with 64x64 tiles",
    language="triton",
)
'''

CUTE_KERNEL = '''
import torch
from kernel_task import input_t, output_t
from kernel_task import BACKENDS


def cute_kernel(data: input_t) -> output_t:
    """Wrapper for CuTe CUDA kernel."""
    a, b, scale_a, scale_b, scale_a_perm, scale_b_perm, c = data

    c.copy_(torch.einsum("mkl,kl->ml", a * scale_a, (b * scale_b)[0]).unsqueeze(1))

    return c

# Register
BACKENDS.register(
    name="cute",
    kernel_fn=cute_kernel,
    description="CuTe FP4 tensor core kernel",
    language="cutlass",
)
'''

#: "Multiple versions of the same kernel", positional registrations; two of them are wrong.
EXPERIMENTS = '''
import torch
from kernel_task import BACKENDS

# Version 1: 64x64 tiles
def triton_v1(data):
    a, b, scale_a, scale_b, scale_a_perm, scale_b_perm, c = data
    torch.sum((a * scale_a) * (b * scale_b), dim=1, keepdim=True, out=c)
    return c

BACKENDS.register("triton_64", triton_v1, "Triton 64x64 tiles", "triton")

# Version 2: computes into a tensor of its own and never writes c
def triton_v2(data):
    a, b, scale_a, scale_b, scale_a_perm, scale_b_perm, c = data
    return ((a * scale_a) * (b * scale_b)).sum(dim=1, keepdim=True)

BACKENDS.register("triton_128", triton_v2, "Triton 128x128 tiles", "triton")

# Version 3: forgets scale_b
def triton_v3(data):
    a, b, scale_a, scale_b, scale_a_perm, scale_b_perm, c = data
    torch.sum((a * scale_a) * b, dim=1, keepdim=True, out=c)
    return c

BACKENDS.register("triton_opt", triton_v3, "Triton optimized", "triton")
'''

#: A one-tuple, value-returning solution kept in the dataset as sources (no module needed).
PLAIN_SOURCE = """
import torch

def run(data):
    a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted = data
    return ((a * scale_a) * (b * scale_b)).sum(dim=1, keepdim=True)
"""


def plain_solution(name: str = f"{DEF}_plain", source: str = PLAIN_SOURCE) -> Solution:
    return Solution(name=name, definition=DEF, author="tests",
                    spec=BuildSpec(language="pytorch", entry_point="main.py::run", destination_passing_style=False),
                    sources=[SourceFile(path="main.py", content=source)])


def write_project(root: Path, task: str = TASK) -> Path:
    """The seed's files and a dataset with the stand-in Definition; returns the dataset."""
    for name, text in (("kernel_task.py", task), ("nvfp4_reference_kernel.py", REFERENCE_KERNEL),
                       ("nvfp4_triton_kernel.py", TRITON_KERNEL),
                       ("nvfp4_cute_kernel.py", CUTE_KERNEL), ("nvfp4_triton_experiments.py", EXPERIMENTS)):
        (root / name).write_text(textwrap.dedent(text))
    ts = TraceSet(root / "dataset")
    ts.add_definition(gemv_definition())
    ts.add_definition(gemv_definition(UNSOLVED))
    for l in L_VALUES:
        ts.add_workload(UNSOLVED, Workload(uuid=f"u{l}", axes={"l": l}, inputs={n: {"type": "random"} for n in SHAPES}))
        ts.add_workload(DEF, Workload(uuid=f"l{l}", axes={"l": l}, inputs={n: {"type": "random"} for n in SHAPES},
                                      seed=random.randrange(1 << 30)))
    ts.add_solution(plain_solution())
    ts.save(root / "dataset")
    return root / "dataset"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The seed's project in a folder on sys.path (kernel files import kernel_task by name), triton
    kernels allowed on the CPU (TRITON_INTERPRET=1, as one runs Triton without a GPU), and
    whatever the test registers in BACKENDS removed afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    before = set(BACKENDS.names())
    yield tmp_path
    for name in set(BACKENDS.names()) - before:
        BACKENDS.unregister(name)
    sys.modules.pop("kernel_task", None)


def _check_against_reference(run, l: int) -> None:
    inputs = random_inputs(l)
    want = gemv_definition().reference_fn()(*inputs)
    torch.testing.assert_close(run(*inputs), want, atol=1e-4, rtol=1e-4)


def test_seed_files_register_and_run(project):
    write_project(project)
    new = load_solution_modules([project / "nvfp4_reference_kernel.py", project / "nvfp4_triton_kernel.py",
                                 project / "nvfp4_cute_kernel.py", project / "nvfp4_triton_experiments.py"])
    assert new == ["reference", "triton", "cute", "triton_64", "triton_128", "triton_opt"]
    triton = BACKENDS.get("triton")
    assert triton.definition == DEF and triton.spec.language == "triton" and triton.spec.destination_passing_style
    assert triton.description == "Triton FP4 GEMV with 64x64 tiles"
    assert BACKENDS.get("cute").description == "CuTe FP4 tensor core kernel (language: cutlass)"
    assert BACKENDS.get("triton_64").description == "Triton 64x64 tiles"
    definition = gemv_definition()
    for name in ("reference", "triton", "cute", "triton_64"):
        run = BACKENDS.build(name, definition, "cpu")
        assert run.calling == "tuple"
        _check_against_reference(run, random.choice(L_VALUES))
        c = torch.full((16, 1, 2), float("nan"))
        inputs = random_inputs(2)
        run.call_into(*inputs, c)  # the caller's c, filled in place
        torch.testing.assert_close(c, definition.reference_fn()(*inputs), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="not its output c"):
        BACKENDS.build("triton_128", definition, "cpu")(*random_inputs(1))


def test_seed_files_with_a_registry_of_their_own(project):
    write_project(project, task=TASK_OWN_REGISTRY)
    load_solution_modules([project / "nvfp4_triton_kernel.py"])
    task = sys.modules["kernel_task"].BACKENDS
    assert isinstance(task, Registry) and task is not BACKENDS
    assert task.names() == ["triton"] and "triton" not in BACKENDS
    _check_against_reference(task.build("triton", gemv_definition(), "cpu"), 3)


def _rows(out: str) -> dict[str, str]:
    """Summary rows by solution name, one line each (with several Definitions, the Definition
    comes first)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│|┃]", line) if c.strip()]
        if len(cells) >= 4 and re.search(r"\d+\.\d% \(\d+/\d+\)|not run|build failed", line):
            rows[cells[1] if cells[0] in (DEF, UNSOLVED) else cells[0]] = line
    return rows


def test_seed_smoke_command_piped(project):
    """``python -m kernel_utils.smoke_test reference triton cute`` becomes this; its output goes
    to a pipe, where every line must stay whole."""
    dataset = write_project(project)
    proc = subprocess.run([sys.executable, "-m", "opforge.smoke_test", "reference", "triton", "cute",
                           "--module", "nvfp4_reference_kernel.py", "--module", "nvfp4_triton_kernel.py",
                           "--module", "nvfp4_cute_kernel.py",
                           "--dataset", str(dataset), "--device", "cpu"],
                          cwd=project, capture_output=True, text=True, env={**os.environ, "COLUMNS": "60"})
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "quick indication" in out and "`opforge run` measures properly" in out
    lines = out.splitlines()
    # Per test: a header per solution, then one line per workload with its status and time.
    for name, description in ((f"{DEF}_reference", "The reference implementation"), ("reference", "PyTorch reference"),
                              ("triton", "Triton FP4 GEMV with 64x64 tiles"), ("cute", "CuTe FP4 tensor core kernel")):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{name} (") and description in line)
        for l, line in zip(L_VALUES, lines[start + 1:start + 1 + len(L_VALUES)]):
            assert re.match(rf"^  l={l}\s+PASS\s+\d+\.\d{{3}} ms\s+\d+\.\d\d× vs reference", line), line
    # The summary: one whole line per solution, the Definition's reference first (the module's
    # "reference" is a solution like the others), however narrow the terminal.
    rows = _rows(out)
    assert list(rows) == [f"{DEF}_reference", "reference", "triton", "cute"], out
    for name, language in ((f"{DEF}_reference", "python"), ("reference", "pytorch"), ("triton", "triton"),
                           ("cute", "python")):
        assert re.search(rf"{name}\W+{language}\W+100\.0% \(2/2\)\W+\d+\.\d\d×", rows[name]), rows[name]
    assert re.search(r"1\.00×", rows[f"{DEF}_reference"])
    assert "8 passed, 0 failed, 0 skipped" in out


def test_failing_versions_fail_the_run(project, capsys):
    dataset = write_project(project)
    code = cli.main(["smoke", "triton_64", "triton_128", "triton_opt", "--module",
                     str(project / "nvfp4_triton_experiments.py"), "--dataset", str(dataset), "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert re.search(r"^  l=1\s+FAIL .*c: 16 of 16 elements outside atol=0\.0001", out, re.M), out
    assert re.search(r"^  l=3\s+ERROR\s+ValueError: solution 'triton_128': returned a value that is not its "
                     r"output c", out, re.M), out
    rows = _rows(out)
    assert re.search(r"triton_64\W+triton\W+100\.0% \(2/2\)\W+\d+\.\d\d×", rows["triton_64"])
    assert re.search(r"0\.0% \(0/2\)\W+–\W+l=1: ERROR ValueError: returned a value that is not its output c",
                     rows["triton_128"])
    assert re.search(r"0\.0% \(0/2\)\W+–\W+l=1: FAIL c: 16 of 16", rows["triton_opt"])
    assert "2 passed, 4 failed, 0 skipped" in out


def test_short_names_references_and_dataset_solutions(project, capsys):
    """``plain`` is the dataset's <definition>_plain; ``reference`` alone: every Definition's."""
    dataset = write_project(project)
    assert cli.main(["smoke", "plain", "reference", "--dataset", str(dataset), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert list(_rows(out)) == [f"{DEF}_reference", f"{DEF}_plain"]
    assert cli.main(["smoke", "reference", "--dataset", str(dataset), "--device", "cpu"]) == 0
    assert sorted(_rows(capsys.readouterr().out)) == sorted([f"{DEF}_reference", f"{UNSOLVED}_reference"])
    with pytest.raises(SystemExit, match="no solution or definition named triton"):
        cli.main(["smoke", "triton", "--dataset", str(dataset), "--device", "cpu"])
    # A Definition without solutions: its reference only when asked for.
    with pytest.raises(SystemExit, match=f"no solution of {UNSOLVED} .*add the name reference"):
        cli.main(["smoke", UNSOLVED, "--dataset", str(dataset), "--device", "cpu"])
    assert cli.main(["smoke", UNSOLVED, "reference", "--dataset", str(dataset), "--device", "cpu"]) == 0
    assert list(_rows(capsys.readouterr().out)) == [f"{UNSOLVED}_reference"]


def test_solution_that_cannot_run_here_is_skipped(project, capsys):
    dataset = write_project(project)
    (project / "gpu_only.py").write_text(textwrap.dedent(f"""
        from opforge.registry import BACKENDS
        BACKENDS.register("cuda", lambda data: data[-1], "CUDA kernel", "cuda", definition="{DEF}",
                          destination_passing_style=True)
    """))
    code = cli.main(["smoke", "cuda", "--module", str(project / "gpu_only.py"), "--dataset", str(dataset),
                     "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"cuda\W+cuda\W+not run\W+–\W+UNSUPPORTED: targets cuda; this device is cpu", _rows(out)["cuda"])
    assert "0 passed, 0 failed, 1 skipped" in out


# --- the runner ---------------------------------------------------------------------------------

WRONG_DPS_SOURCE = """
import torch

def run(data):
    a, b, scale_a, scale_b, scale_a_permuted, scale_b_permuted, c = data
    c.copy_(((a * scale_a) * b).sum(dim=1, keepdim=True))  # forgets scale_b
    return c
"""


def test_runner_runs_one_tuple_kernels(project, monkeypatch):
    """``opforge run`` on the CPU: a seed kernel from its module (destination-passing, the
    function lives in the worker), a one-tuple value-returning and a wrong one-tuple
    destination-passing solution from the dataset."""
    from opforge.bench import Benchmark, BenchmarkConfig, Settings

    dataset = write_project(project)
    ts = TraceSet.load(dataset)
    ts.add_solution(Solution(name=f"{DEF}_wrong", definition=DEF, author="tests",
                             spec=BuildSpec(language="python", entry_point="main.py::run"),
                             sources=[SourceFile(path="main.py", content=WRONG_DPS_SOURCE)]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]))
    fast = Settings(iterations=3, warmup=1, max_time_s=0.2, timeout_s=30, cuda_graph=False)
    config = BenchmarkConfig(devices=["cpu"], defaults=fast, baseline=None, time_reference=False,
                             modules=[str(project / "nvfp4_triton_kernel.py")])
    traces = Benchmark(ts, config).run_all()
    status = {(t.solution, t.workload.uuid): t.evaluation.status.value for t in traces}
    assert status == {(name, f"l{l}"): want for l in L_VALUES
                      for name, want in (("triton", "PASSED"), (f"{DEF}_plain", "PASSED"),
                                         (f"{DEF}_wrong", "INCORRECT_NUMERICAL"))}, \
        [(t.solution, t.evaluation.log) for t in traces]
    for t in traces:
        if t.solution != f"{DEF}_wrong":
            assert t.evaluation.correctness.max_absolute_error <= 1e-4
            assert t.evaluation.performance.latency_ms > 0
