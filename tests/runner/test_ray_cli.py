"""``opforge run --ray`` before any cluster is involved: without Ray it says how to install it,
and it refuses options a cluster run cannot honour (neither needs Ray installed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_cases import HONEST, make_dataset  # noqa: E402

from opforge.cli import main  # noqa: E402


@pytest.fixture
def dataset(tmp_path):
    make_dataset(tmp_path / "ds", {"honest": HONEST})
    return tmp_path / "ds"


@pytest.mark.parametrize("address", [[], ["auto"]])
def test_without_ray_the_flag_says_how_to_install_it(dataset, monkeypatch, address):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    with pytest.raises(SystemExit) as info:
        main(["run", "--dataset", str(dataset), "--ray", *address])
    message = str(info.value)
    assert message.startswith("opforge run: --ray needs Ray") and "pip install 'opforge[ray]'" in message
    assert not (dataset / "traces").exists()


def test_a_cluster_run_takes_every_gpu_or_the_nodes_cpus_not_a_device_list(dataset):
    with pytest.raises(SystemExit) as info:
        main(["run", "--dataset", str(dataset), "--ray", "--devices", "cuda:1"])
    assert "with --ray every GPU of the cluster is used" in str(info.value)


def test_the_flag_is_documented_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--ray [ADDRESS]" in out and "opforge[ray]" in out


def test_the_closing_lines_say_what_each_gpu_model_had_and_what_the_cluster_lost():
    from types import SimpleNamespace

    from opforge.bench.cluster import ClusterLog
    from opforge.bench.cluster.cli import closing_lines

    log = ClusterLog(groups={"NVIDIA H100": [("a (node 1111) cuda:0", 3010.4), ("a (node 1111) cuda:1", 2950.2),
                                             ("b (node 2222) cuda:0", 2990.0)],
                             "NVIDIA H200": [("c (node 3333) cuda:0", 4400.0)]},
                     retried=["d / batch=4 / s"], lost=["b (node 2222) cuda:0: ActorDiedError: ..."],
                     never_started=["device worker 5: still waiting for a GPU when the work was done"])
    assert closing_lines(SimpleNamespace(cluster=log)) == [
        "NVIDIA H100: 3 device worker(s) on 2 node(s), copy bandwidth 2950-3010 GB/s",
        "NVIDIA H200: 1 device worker(s) on 1 node(s), copy bandwidth 4400 GB/s",
        "1 device worker(s) died during the run; 1 pair(s) in flight were retried elsewhere, 0 lost twice and "
        "recorded as RUNTIME_ERROR",
        "1 device worker(s) never started: device worker 5: still waiting for a GPU when the work was done"]
