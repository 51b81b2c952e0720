"""Offline check of opforge's inputs for public FlashInfer-Trace Definitions (files without
workloads or value domains): small var-axis values solved from the Definition's equality
constraints, inputs from opforge.bench.generate_inputs, the reference run on CPU.

    python3 check_public_definitions.py FOLDER_OF_DEFINITION_JSONS   (writes rows.json beside it)
"""
import ast
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
LIMIT = 1 << 31  # bytes of inputs

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

def main(root):
    rows = []
    for path in sorted(Path(root).rglob("*.json")):
        name = path.stem
        try:
            d = Definition.from_dict(json.loads(path.read_text()))
        except Exception as e:
            rows.append((path.parent.name, name, "LOAD", f"{type(e).__name__}: {str(e)[:160]}")); continue
        axes = solve_axes(d)
        try:
            size = nbytes(d, axes)
        except Exception as e:
            rows.append((path.parent.name, name, "SHAPES", f"{type(e).__name__}: {str(e)[:160]}")); continue
        if size > LIMIT:
            rows.append((path.parent.name, name, "SKIP", f"{size / 2**30:.1f} GiB of inputs")); continue
        w = Workload(uuid="w", axes=axes, inputs={n: RandomInput() for n in d.inputs})
        try:
            signal.alarm(120)
            args = generate_inputs(d, w, seed=1)
            out = d.reference_fn()(*args)
            signal.alarm(0)
        except Exception as e:
            signal.alarm(0)
            tb = traceback.extract_tb(e.__traceback__)[-1]
            rows.append((path.parent.name, name, "FAIL", f"{type(e).__name__}: {str(e)[:140]} @ {Path(tb.filename).name}:{tb.lineno}")); continue
        outs = out if isinstance(out, (tuple, list)) else (out,)
        bad = []
        for o in outs:
            if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel():
                f = o.float()
                nonfinite = (~torch.isfinite(f)) & ~torch.isneginf(f)  # -inf lse of empty requests is defined
                if bool(nonfinite.any()):
                    bad.append(f"{int(nonfinite.sum())}/{o.numel()} non-finite")
        rows.append((path.parent.name, name, "NAN" if bad else "OK", "; ".join(bad) + f" axes={axes}" if bad else ""))
    from collections import Counter
    print(Counter(r[2] for r in rows))
    for r in rows:
        if r[2] != "OK":
            print(" | ".join(r))
    json.dump(rows, open(Path(__file__).with_name("rows.json"), "w"), indent=1)

def _alarm(*_):
    raise TimeoutError("reference took over 120 s")
signal.signal(signal.SIGALRM, _alarm)
main(sys.argv[1])
