"""Forced norm shapes with 16- and 8-byte vectors (OPF_NORM_VEC8 read once per process: run twice)."""
import os, random, statistics, sys, json
import torch
sys.path.insert(0, "bench")
import opspecs, timing
from opspecs import SPEC
from opforge import _ext
_C = _ext._C
stream = _ext.cuda_stream
from roofline import configure_dynamo
configure_dynamo()
liger, _ = opspecs.liger_peers()
rng = random.Random(int(os.environ.get("SEED", "0")))
CASES = [(1, 512), (1, 768), (1, 1024), (8, 1024), (32, 1024), (256, 512), (32, 512), (1, 2048), (32, 2048), (1, 4096)]
TRIALS = int(os.environ.get("TRIALS", "8"))
peers = os.environ.get("PEERS", "1") == "1"
tag = "v8" if os.environ.get("OPF_NORM_VEC8") else "v16"
res = {}
with torch.no_grad():
    for rows, hidden in CASES:
        spec = SPEC["rmsnorm"]
        base = opspecs.make_input_sets(spec, rows, hidden, torch.bfloat16, "cuda", 1)[0]
        comp = torch.compile(spec.formula, dynamic=False, fullgraph=True) if peers else None
        times, keep = {}, []
        for _ in range(TRIALS):
            spacer, inp = opspecs.placed_copy(base, rng)
            keep.append(spacer)
            x, w = inp
            o = torch.empty_like(x)
            for vpt in (-1, 1, 2, 4):
                f = lambda vpt=vpt: _C.norm(o, x, None, None, w, 1e-6, False, stream(0), True, vpt, False)
                try:
                    f(); torch.cuda.synchronize()
                    ref = spec.formula(x.float(), w.float())
                    assert torch.allclose(o.float(), ref, rtol=2e-2, atol=2e-2)
                    times.setdefault(f"{tag}:{vpt}", []).append(timing.replay_or_host_us(f, True))
                except Exception as e:
                    times.setdefault(f"{tag}:{vpt}", []).append(float("nan"))
            if peers:
                comp(*inp); torch.cuda.synchronize()
                times.setdefault("compile", []).append(timing.replay_or_host_us(lambda: comp(*inp), True))
                peer = liger[spec.liger][1]
                times.setdefault("liger", []).append(timing.replay_or_host_us(lambda: peer(*inp), True))
        med = {k: statistics.median(v) for k, v in times.items()}
        res[f"{rows}x{hidden}"] = med
        print(f"{rows}x{hidden}: " + "  ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)
json.dump(res, open(os.environ.get("OUTJSON", "/dev/null"), "w"))
