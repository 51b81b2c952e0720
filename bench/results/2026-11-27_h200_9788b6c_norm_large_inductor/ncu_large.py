"""ncu target: the large norms where torch.compile leads (one call each, caches flushed by ncu)."""
import os, sys
import torch
sys.path.insert(0, "bench")
import opspecs
from opspecs import SPEC
from roofline import configure_dynamo

CASES = [("fused_add_rmsnorm", 32768, 4096, torch.bfloat16), ("rmsnorm", 32768, 4096, torch.float32),
         ("rmsnorm", 32768, 4096, torch.bfloat16)]
liger, _ = opspecs.liger_peers()
configure_dynamo()
calls = []
with torch.no_grad():
    for op, rows, hidden, dt in CASES:
        spec = SPEC[op]
        inputs = opspecs.make_input_sets(spec, rows, hidden, dt, "cuda", 1)[0]
        outs = opspecs.make_outputs(spec, inputs)
        comp = torch.compile(spec.formula, dynamic=False, fullgraph=True)
        impls = [("opforge", spec.bound_call(inputs, outs)), ("compile", lambda c=comp, i=inputs: c(*i))]
        if spec.liger in liger:
            impls.append(("liger", lambda f=liger[spec.liger][1], i=inputs: f(*i)))
        for name, fn in impls:
            for _ in range(3):
                fn()
            calls.append((f"{op} {rows}x{hidden} {dt} {name}", fn))
    torch.cuda.synchronize()
    for label, fn in calls:
        print("CALL", label, flush=True)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
