"""The built-in dataset shipped in the wheel: present, loadable, and identical to what the
templates generate (regenerate with `python -m opforge.trace.builtin --write python/opforge/data/builtin`)."""

from __future__ import annotations

import filecmp
import json
import sys
from pathlib import Path

from opforge.trace import builtin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fib_schema import FIB_DTYPES  # noqa: E402


def test_shipped_dataset_matches_the_templates(tmp_path):
    builtin.build_trace_set().save_dataset(tmp_path)
    shipped = builtin.builtin_dataset_path()
    assert shipped.is_dir(), f"the wheel ships no built-in dataset at {shipped}"

    def compare(a, b, where=""):
        cmp = filecmp.dircmp(a, b)
        assert not cmp.left_only and not cmp.right_only, (where, cmp.left_only, cmp.right_only)
        _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
        assert not mismatch and not errors, (where, mismatch, errors)
        for sub in cmp.common_dirs:
            compare(a / sub, b / sub, f"{where}/{sub}")

    compare(tmp_path, shipped)


def test_builtin_dataset_loads_strictly_with_every_op():
    trace_set = builtin.load_builtin_trace_set()
    names = set(trace_set.definitions)
    for prefix in ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm",
                   "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "scale"):
        for size in builtin.HIDDEN_SIZES:
            abbrev = "d" if prefix.endswith("_and_mul") else "h"
            assert f"{prefix}_{abbrev}{size}" in names
    for m, k in builtin.NVFP4_GEMV_SHAPES:
        assert f"nvfp4_gemv_m{m}_k{k}" in names
    for h, kv, d, ps in builtin.PAGED_DECODE_SHAPES:
        for suffix in ("", "_f16"):
            assert f"gqa_paged_decode_h{h}_kv{kv}_d{d}_ps{ps}{suffix}" in names
    for name, definition in trace_set.definitions.items():
        workloads = trace_set.get_workloads(name)
        want = builtin.builtin_workload_axes(definition)
        key = lambda axes: sorted(axes.items())  # noqa: E731
        assert sorted(map(key, (w.workload.axes for w in workloads))) == sorted(map(key, want))
        for w in workloads:
            definition.check_workload(w.workload)


def test_shipped_python_solutions_say_python():
    """FlashInfer-Bench's language list has "python" but no "pytorch": the plain-PyTorch
    solutions opforge ships say "python" (opforge reads both alike)."""
    trace_set = builtin.load_builtin_trace_set()
    languages = {str(s.spec.language.value) for group in trace_set.solutions.values() for s in group}
    assert "pytorch" not in languages and "python" in languages


def test_shipped_definitions_use_flashinfer_bench_dtypes():
    """FlashInfer-Bench refuses a Definition file with a dtype outside its list (its from_path then
    reads nothing of the folder): every tensor of every shipped Definition file, the NVFP4 ones
    included (FP4 as "float4_e2m1"), uses one of its dtypes."""
    files = sorted((builtin.builtin_dataset_path() / "definitions").rglob("*.json"))
    assert len(files) >= 50
    for path in files:
        record = json.loads(path.read_text())
        for name, spec in {**record["inputs"], **record["outputs"]}.items():
            assert spec["dtype"] in FIB_DTYPES, (path.name, name, spec["dtype"])
