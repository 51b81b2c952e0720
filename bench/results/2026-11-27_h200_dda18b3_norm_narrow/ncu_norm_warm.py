"""ncu target: rmsnorm at rows of 512-1024 elements, each implementation called REPEATS times in the profiled range."""
import os, sys
import torch
sys.path.insert(0, "bench")
import opspecs
from opspecs import SPEC
from roofline import configure_dynamo

CASES = [("rmsnorm", 1, 1024), ("rmsnorm", 32, 1024), ("rmsnorm", 256, 512)]
REPEATS = int(os.environ.get("REPEATS", "1"))
liger, _ = opspecs.liger_peers()
configure_dynamo()
calls = []
with torch.no_grad():
    for op, rows, hidden in CASES:
        spec = SPEC[op]
        inputs = opspecs.make_input_sets(spec, rows, hidden, torch.bfloat16, "cuda", 1)[0]
        outs = opspecs.make_outputs(spec, inputs)
        comp = torch.compile(spec.formula, dynamic=False, fullgraph=True)
        impls = [("opforge", spec.bound_call(inputs, outs)), ("compile", lambda c=comp, i=inputs: c(*i))]
        if spec.liger in liger:
            impls.append(("liger", lambda f=liger[spec.liger][1], i=inputs: f(*i)))
        for name, fn in impls:
            for _ in range(5):
                fn()
            calls.append((f"{op} {rows}x{hidden} {name}", fn))
    torch.cuda.synchronize()
    for label, fn in calls:
        print("CALL", label, flush=True)
        torch.cuda.profiler.start()
        for _ in range(REPEATS):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
