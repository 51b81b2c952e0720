"""Apply and opforge's own op in its python form: a dataset written before that form routes as
it did, only the exact record opforge generates for a Definition counts as the op itself, and
an imitation of it (even one named like it) is served as the solution it is."""

from __future__ import annotations

import json

import torch

import opforge
from apply_helpers import builtin, dataset, isolated, measured, tagging, template_definition  # noqa: F401
from opforge.apply import enable_apply
from opforge.registry import builtin_solution
from opforge.trace.own_op import read_own_op

NORM = template_definition("rmsnorm", hidden_size=64)  # rmsnorm_h64_f32: eps is an input
OWN = builtin(NORM).name
#: NORM's builtin record as opforge wrote it before the python form.
LEGACY = {"name": OWN, "definition": NORM.name, "author": "opforge",
          "spec": {"language": "builtin", "target_hardware": ["cpu", "cuda"], "entry_point": "builtin.json::rmsnorm",
                   "dependencies": [], "destination_passing_style": False, "binding": None},
          "sources": [{"path": "builtin.json",
                       "content": '{"inputs": {"hidden_states": "input"}, "outputs": ["output"]}'}]}


def _call(rng, batch=8):
    x, w = rng.randn(batch, 64), rng.randn(64)
    return x, w, opforge.rmsnorm(x, w, 1e-6)


def test_a_dataset_with_legacy_builtin_records_routes_to_the_op(tmp_path, rng):
    ts = dataset([NORM], [tagging("A", NORM, 1.0), builtin(NORM)],
                 [measured(NORM, "A", {"batch_size": 4}, 1.0), measured(NORM, OWN, {"batch_size": 4}, 2.0),
                  measured(NORM, "A", {"batch_size": 64}, 2.0), measured(NORM, OWN, {"batch_size": 64}, 1.0)])
    ts.save_dataset(tmp_path / "ds")
    (path,) = (tmp_path / "ds" / "solutions" / "opforge").rglob(f"{OWN}.json")
    path.write_text(json.dumps(LEGACY), encoding="utf-8")  # as an older opforge left it
    handle = enable_apply(tmp_path / "ds")
    assert torch.unique(_call(rng, 4)[2]).tolist() == [1.0]  # the contributed solution beat the op there
    x, w, y = _call(rng, 64)
    torch.testing.assert_close(y, opforge.rmsnorm(x, w, 1e-6, backend="cpu"), rtol=0, atol=0)
    assert handle.choices(NORM.name, batch_size=4) == ["A", OWN]
    assert handle.choices(NORM.name, batch_size=64) == [OWN]
    assert handle.runnable(NORM.name, OWN) is None  # the op itself ran on: nothing was built for it


def test_an_imitation_named_like_the_builtin_is_served_as_itself(rng):
    text = builtin(NORM).sources[0].content
    fake = builtin(NORM).to_dict()
    fake["sources"][0]["content"] = text + ("\n_run = run\n\n\ndef run(hidden_states, weight, eps):\n"
                                            "    return _run(hidden_states, weight, eps) * 0 + 3.0\n")
    imitation = type(builtin(NORM)).from_dict(fake)
    assert imitation.name == OWN and read_own_op(imitation) is None
    traces = [measured(NORM, OWN, {"batch_size": 8}, 1.0), measured(NORM, "A", {"batch_size": 8}, 2.0)]
    handle = enable_apply(dataset([NORM], [tagging("A", NORM, 1.0), imitation], traces))
    assert torch.unique(_call(rng)[2]).tolist() == [3.0]  # its code ran: it was not taken for the op
    runnable = handle.runnable(NORM.name, OWN)
    assert runnable is not None and runnable.build_dir is not None


def test_the_generated_form_of_another_mapping_is_a_contributed_solution(rng):
    """The generated form for eps fixed at 0.5 is recognised (built by calling the op, nothing
    imported) but is not opforge's own op for NORM: when it measures fastest it serves, and it
    computes what its mapping says."""
    loose = builtin_solution(NORM, "rmsnorm", inputs={"eps": None}, constants={"eps": 0.5}, name="L")
    traces = [measured(NORM, "L", {"batch_size": 8}, 1.0), measured(NORM, OWN, {"batch_size": 8}, 2.0)]
    handle = enable_apply(dataset([NORM], [loose, builtin(NORM)], traces))
    assert handle.choices(NORM.name, batch_size=8) == ["L", OWN]
    x, w, y = _call(rng)
    torch.testing.assert_close(y, opforge.rmsnorm(x, w, 0.5, backend="cpu"), rtol=0, atol=0)
    runnable = handle.runnable(NORM.name, "L")
    assert runnable.fn.__name__ == "builtin_rmsnorm" and runnable.build_dir is None
