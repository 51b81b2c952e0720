"""``opforge run --ray`` on a simulated cluster: several Ray nodes on this machine (Ray's cluster
utilities), each with fake GPU slots whose device workers evaluate on the CPU. A cluster run
records what a local run of the same seed records; a node killed mid-run costs only the pair in
flight there; a solution that takes its device worker down is retried once elsewhere, then
recorded as RUNTIME_ERROR; a driver killed mid-run leaves a dataset that --resume completes, and
Ctrl-C stops every device worker and every solution process on every node."""

from __future__ import annotations

import _thread
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the cluster runner's tests need Ray (pip install 'opforge[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_cases import (DEF, FAST_OPTIONS, HONEST, KILLS_ITS_DEVICE_WORKER, SEGFAULT, SLOW, WRONG,  # noqa: E402
                       all_gone, cli_env, config, in_step, make_dataset, pairs, pids_in, recorder, wait_for)

from opforge.bench import Benchmark  # noqa: E402
from opforge.cli import main  # noqa: E402
from opforge.bench.cluster import RayBenchmark, RayConfig  # noqa: E402
from opforge.trace import TraceSet  # noqa: E402

ON_CPU = RayConfig(device="cpu")
# A killed node is declared dead after three missed one-second health checks, not after Ray's
# defaults (a check every 3 s, five misses, after a 5 s grace): the node-loss test took 53 s, 26 s
# with these.
FAST_FAILURE_DETECTION = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                          "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
    """Two nodes with one GPU slot each; tests may add nodes of their own (and kill them)."""
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 1, "num_gpus": 1, "_system_config": FAST_FAILURE_DETECTION})
    c.add_node(num_cpus=1, num_gpus=1)
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def outcome(traces) -> dict:
    """What must not depend on where a pair ran: status, seed, errors, the input sets checked."""
    out = {}
    for t in traces:
        ev = t.evaluation
        c = ev.correctness
        out[(t.solution, t.workload.uuid)] = (ev.status.value, ev.seed, ev.definition_hash, ev.solution_hash,
                                              None if c is None else (c.max_absolute_error, c.max_relative_error,
                                                                      (c.extra or {}).get("input_sets")))
    return out


MODULE = """
from pathlib import Path
from opforge.registry import BACKENDS

with open({where!r}, "a") as f:  # where each process loading it found it
    f.write(str(Path(__file__).resolve()) + "\\n")

def mul(x, w):
    return x * w

BACKENDS.register("mul_h8_from_module", mul, "x * w from a module", "pytorch", definition="mul_h8")
"""


def test_a_cluster_run_records_what_a_local_run_of_the_same_seed_records(cluster, tmp_path):
    sources = {"honest": HONEST, "wrong_values": WRONG, "segfault": SEGFAULT}
    module = tmp_path / "kernels" / "my_kernels.py"
    module.parent.mkdir()
    module.write_text(MODULE.format(where=str(tmp_path / "loaded_from")))
    local_run = Benchmark(make_dataset(tmp_path / "local", sources), config(modules=[str(module)]))
    failed = []

    def run_locally():  # meanwhile: the two runs share nothing but the seed
        try:
            local_run.run_all()
        except BaseException as exc:  # noqa: BLE001 - the test's failure, below
            failed.append(exc)

    local = threading.Thread(target=run_locally)
    local.start()
    ts = make_dataset(tmp_path / "cluster", sources)
    seen = []
    bench = RayBenchmark(ts, config(modules=[str(module)]), ON_CPU, on_result=seen.append)
    traces = bench.run_all()
    local.join()
    assert not failed, failed
    assert outcome(traces) == outcome(local_run.result.traces)
    assert {k: v[0] for k, v in outcome(traces).items()} == {
        (f"{DEF}_{name}", uuid): status for uuid in ("b4", "b32") for name, status in
        (("honest", "PASSED"), ("wrong_values", "INCORRECT_NUMERICAL"), ("segfault", "RUNTIME_ERROR"),
         ("from_module", "PASSED"))}
    # The module's files went to the nodes with the run: its solution was loaded from a node's copy,
    # which went away with the device worker.
    copies = set((tmp_path / "loaded_from").read_text().splitlines()) - {str(module.resolve())}
    assert copies
    wait_for(lambda: not any(Path(c).exists() for c in copies), 30, "the nodes' copies of the module to go")
    # Every result streamed back as it was made, and the driver appended it to the dataset.
    assert len(seen) == len(traces) and not bench.result.skipped
    assert pairs(TraceSet.load(tmp_path / "cluster").get_traces(DEF)) == pairs(traces)
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    for t in traces:
        info = t.evaluation.environment.hardware_info
        assert info["ray_node_id"] in nodes and info["copy_gbps"] > 0 and t.evaluation.device == "cpu"
        if t.is_successful():
            assert round(t.evaluation.performance.calibrated_gbps, 1) == info["copy_gbps"]
    # One device worker per GPU slot: both joined, or the one still starting when the other had
    # done all the work was let go as such (a worker's pairs take milliseconds once it is up).
    joined, late = [len(workers) for workers in bench.cluster.groups.values()], bench.cluster.never_started
    assert joined == [2] and not late or joined == [1] and len(late) == 1 and \
        late[0].endswith(": still waiting for a GPU when the work was done"), (joined, late)
    assert not bench.cluster.lost


def test_a_node_killed_mid_run_costs_only_the_pair_in_flight_there(cluster, tmp_path):
    doomed = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    (tmp_path / "entered").mkdir()  # the slow pairs wait there until all three device workers have one
    slow = in_step(tmp_path / "entered", workers=3)
    ts = make_dataset(tmp_path / "ds", {"honest": HONEST, "slow": slow}, batches=(4, 8, 16, 32))
    killed = threading.Event()

    def kill_its_node(item):  # once the doomed node's worker has a result in, its next pair is in flight
        if getattr(item, "evaluation", None) and not killed.is_set() \
                and item.evaluation.environment.hardware_info["ray_node_id"] == doomed.node_id:
            killed.set()
            threading.Thread(target=cluster.remove_node, args=(doomed, False)).start()

    bench = RayBenchmark(ts, config(), ON_CPU, on_result=kill_its_node)
    traces = bench.run_all()
    assert killed.is_set(), "the doomed node got no work"
    every = {(f"{DEF}_{name}", f"b{b}") for name in ("honest", "slow") for b in (4, 8, 16, 32)}
    assert sorted(pairs(traces)) == sorted(every) and len(traces) == len(every)  # each once
    assert all(t.is_successful() for t in traces), [t.evaluation.log for t in traces if not t.is_successful()]
    assert len(bench.cluster.lost) == 1 and doomed.node_id[:8] in bench.cluster.lost[0]
    assert len(bench.cluster.retried) == 1 and not bench.cluster.given_up
    definition, label, solution = bench.cluster.retried[0].split(" / ")
    retried = next(t for t in traces if t.solution == solution and label == f"batch={t.workload.axes['batch']}")
    assert retried.evaluation.environment.hardware_info["ray_node_id"] != doomed.node_id


def test_a_pair_that_takes_its_device_worker_down_is_retried_once_then_recorded(cluster, tmp_path):
    ts = make_dataset(tmp_path / "ds", {"honest": HONEST, "killer": KILLS_ITS_DEVICE_WORKER}, batches=(4,))
    bench = RayBenchmark(ts, config(), ON_CPU)
    traces = {t.solution: t for t in bench.run_all()}
    assert {name: t.evaluation.status.value for name, t in traces.items()} == {
        f"{DEF}_honest": "PASSED", f"{DEF}_killer": "RUNTIME_ERROR"}
    log = traces[f"{DEF}_killer"].evaluation.log
    assert log.startswith("the device worker evaluating it died each of the 2 times it ran"), log
    assert log.count("\n- on ") == 2 and "ActorDiedError" in log
    nodes = [line.split(" (node ")[1][:8] for line in log.splitlines()[1:]]
    assert nodes[0] != nodes[1]  # retried on the other node
    assert bench.cluster.given_up == [f"{DEF} / batch=4 / {DEF}_killer"] and len(bench.cluster.lost) == 2


def run_cli(dataset: Path, address: str, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "opforge", "run", "--dataset", str(dataset), "--ray", address,
                             "--seed", "11", *FAST_OPTIONS, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli_env(), cwd=dataset.parent)


def test_a_driver_killed_mid_run_leaves_a_dataset_resume_completes(cluster, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    root = tmp_path / "ds"
    make_dataset(root, {"honest": HONEST, "slow": recorder(pids, SLOW)}, batches=(4, 8, 16))
    traces_file = root / "traces" / "tests" / "mul" / f"{DEF}.jsonl"
    driver = run_cli(root, cluster.address)
    try:
        wait_for(lambda: traces_file.exists() and traces_file.read_text().count("\n") >= 2 and pids_in(pids), 120,
                 "the first traces, and the slow solution at work")
    finally:
        driver.kill()
    output = driver.communicate()[0]
    # The driver's job ended with it: Ray stopped its device workers, and their supervisors every
    # solution process they had started.
    assert pids_in(pids) and all_gone(pids_in(pids), 30), output
    first = TraceSet.load(root).get_traces(DEF)
    assert 2 <= len(first) < 6
    rest = RayBenchmark(TraceSet.load(root), config(resume=True), ON_CPU).run_all()
    assert not pairs(first) & pairs(rest)
    assert pairs(first) | pairs(rest) == {(f"{DEF}_{n}", f"b{b}") for n in ("honest", "slow") for b in (4, 8, 16)}
    # Same --seed: every pair of a workload saw the same inputs, whichever run measured it.
    seeds = {}
    for t in TraceSet.load(root).get_traces(DEF):
        seeds.setdefault(t.workload.uuid, set()).add(t.evaluation.seed)
    assert sorted(len(s) for s in seeds.values()) == [1, 1, 1]


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler for the test: _thread.interrupt_main() does nothing where SIGINT
    is ignored, as a pytest started in the background without job control inherits it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_every_device_worker_and_solution(cluster, tmp_path, capsys, ctrl_c_raises):
    pids = tmp_path / "pids"
    pids.mkdir()
    hangs = "import time\n\ndef run(x, w):\n    time.sleep(600)\n"
    root = tmp_path / "ds"
    make_dataset(root, {"honest": HONEST, "hangs": recorder(pids, hangs)}, batches=(4,))

    def press_ctrl_c_once_it_hangs():
        wait_for(lambda: pids_in(pids), 120, "the hanging solution to start")
        _thread.interrupt_main()  # what Ctrl-C does: KeyboardInterrupt in the main thread

    threading.Thread(target=press_ctrl_c_once_it_hangs, daemon=True).start()
    # In this process, on the connection the test already has (as `opforge run --ray ADDRESS`).
    code = main(["run", "--dataset", str(root), "--ray", cluster.address, "--seed", "11", *FAST_OPTIONS,
                 "--timeout", "600"])
    output = capsys.readouterr().out
    assert code == 130, output
    assert "interrupted: 1 traces recorded" in output and "every device worker of the cluster was stopped" in output
    assert all_gone(pids_in(pids), 15), output
