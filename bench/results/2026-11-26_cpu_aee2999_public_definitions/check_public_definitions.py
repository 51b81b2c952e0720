"""Offline check of opforge's inputs for public FlashInfer-Trace Definitions (files without
workloads or value domains): small var-axis values solved from the Definition's equality
constraints, inputs from opforge.bench.generate_inputs, the reference run on CPU.

    python3 check_public_definitions.py FOLDER_OF_DEFINITION_JSONS   (writes rows.json beside it)

Definitions whose inputs exceed IN_PROCESS bytes run one per child process under a memory limit
(MEMORY_LIMIT of address space), so a reference that dequantises gigabytes of weights to fp32
ends as a MemoryError row instead of taking the machine down.
"""
import ast
import resource
import subprocess
import json
import math
import signal
import sys
import traceback
from pathlib import Path
import torch
from opforge.bench import generate_inputs
from opforge.trace import Definition, RandomInput, Workload

DEFAULTS = {"batch_size": 3, "num_pages": 24, "num_kv_indices": 12, "total_tokens": 12, "num_tokens": 12,
            "seq_len": 12, "total_q": 12, "total_kv": 12, "num_q_tokens": 12, "num_kv_tokens": 12,
            "len_indptr": 4, "topk": 2}
LIMIT = 6 << 30  # bytes of inputs: larger is SKIP
IN_PROCESS = 256 << 20  # bytes of inputs run in this process; larger in a child
MEMORY_LIMIT = 18 << 30  # address space of a child

def solve_axes(d):
    values = {n: DEFAULTS.get(n, 4) for n in d.var_axes}
    consts = dict(d.const_axes)
    eqs = []
    for c in (d.constraints or []):
        try:
            tree = ast.parse(c, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq):
            eqs.append((tree.left, tree.comparators[0]))
    for _ in range(5):
        for left, right in eqs:
            for a, b in ((left, right), (right, left)):
                if isinstance(a, ast.Name) and a.id in values:
                    try:
                        v = eval(compile(ast.Expression(b), "c", "eval"), {"math": math}, {**consts, **values})
                        if isinstance(v, (int, float)) and not isinstance(v, bool):
                            values[a.id] = int(v)
                    except Exception:
                        pass
                    break
    return values

def nbytes(d, axes):
    total = 0
    shapes = d.resolve_shapes(axes)
    for name, spec in d.inputs.items():
        shape = shapes.get(name)
        if shape is None:
            continue
        n = 1
        for s in shape:
            n *= s
        total += n * spec.dtype.itemsize
    return total

def check_one(path):
    """(folder, name, verdict, detail) for one Definition file."""
    name = path.stem
    try:
        d = Definition.from_dict(json.loads(path.read_text()))
    except Exception as e:
        return (path.parent.name, name, "LOAD", f"{type(e).__name__}: {str(e)[:160]}")
    axes = solve_axes(d)
    try:
        size = nbytes(d, axes)
    except Exception as e:
        return (path.parent.name, name, "SHAPES", f"{type(e).__name__}: {str(e)[:160]}")
    if size > LIMIT:
        return (path.parent.name, name, "SKIP", f"{size / 2**30:.1f} GiB of inputs")
    if size > IN_PROCESS and not CHILD:
        return in_child(path, size)
    w = Workload(uuid="w", axes=axes, inputs={n: RandomInput() for n in d.inputs})
    try:
        signal.alarm(300)
        args = generate_inputs(d, w, seed=1)
        out = d.reference_fn()(*args)
        signal.alarm(0)
    except Exception as e:
        signal.alarm(0)
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return (path.parent.name, name, "FAIL", f"{type(e).__name__}: {str(e)[:140]} @ {Path(tb.filename).name}:{tb.lineno}")
    outs = out if isinstance(out, (tuple, list)) else (out,)
    bad = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel():
            f = o.float()
            nonfinite = (~torch.isfinite(f)) & ~torch.isneginf(f)  # -inf lse of empty requests is defined
            if bool(nonfinite.any()):
                bad.append(f"{int(nonfinite.sum())}/{o.numel()} non-finite")
    return (path.parent.name, name, "NAN" if bad else "OK", "; ".join(bad) + f" axes={axes}" if bad else "")


def in_child(path, size):
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))  # noqa: E731
    done = subprocess.run([sys.executable, __file__, "--one", str(path)], capture_output=True, text=True,
                          preexec_fn=limit, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if lines:
        return tuple(json.loads(lines[-1]))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return (path.parent.name, path.stem, "FAIL", f"child exited {done.returncode} ({size / 2**30:.1f} GiB of inputs): {tail[:140]}")


def main(root):
    rows = []
    for path in sorted(p for p in Path(root).rglob("*.json") if not any(part.startswith(".") for part in p.parts)):
        rows.append(check_one(path))
        print(rows[-1][:3], flush=True)
    from collections import Counter
    print(Counter(r[2] for r in rows))
    for r in rows:
        if r[2] != "OK":
            print(" | ".join(r))
    json.dump(rows, open(Path(__file__).with_name("rows.json"), "w"), indent=1)


def _alarm(*_):
    raise TimeoutError("reference took over 300 s")
signal.signal(signal.SIGALRM, _alarm)
CHILD = sys.argv[1] == "--one"
if CHILD:
    print(json.dumps(check_one(Path(sys.argv[2]))), flush=True)
else:
    main(sys.argv[1])
