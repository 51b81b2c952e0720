"""Turning tracing on and off: nesting, disable_tracing, the op hook, folders that cannot be
written, Definition files already on disk, a full write queue, torn files, CUDA graph capture,
and failures that must not reach the model."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracing_helpers import GATHER, GatherCall, kinds, load, workloads  # noqa: E402

import opforge  # noqa: E402
from opforge import _hooks, intercept  # noqa: E402
from opforge.tracing import TracingConfig, current_tracer, disable_tracing, enable_tracing, record  # noqa: E402
from opforge.tracing import dataset as dataset_module  # noqa: E402
from opforge.tracing import tracer as tracer_module  # noqa: E402
from opforge.trace.templates import definition_for_name  # noqa: E402

H = 96
NORM = f"rmsnorm_h{H}_f32"
ALL = {NORM: TracingConfig("dump_all", "keep_all")}


@pytest.fixture(autouse=True)
def tracing_off():
    yield
    disable_tracing()
    assert intercept.tracer() is None


def test_nested_tracings_take_over_and_give_back(tmp_path, rng, capsys):
    x, w = rng.randn(2, H), rng.randn(H)
    outer = enable_tracing(dataset_dir=tmp_path / "outer", tracing_configs=ALL)
    assert intercept.tracer() is outer and current_tracer() is outer and _hooks.active
    opforge.rmsnorm(x, w)
    with enable_tracing(dataset_dir=tmp_path / "inner", tracing_configs=ALL) as inner:
        assert intercept.tracer() is inner
        assert len(workloads(tmp_path / "outer", NORM)) == 1  # the outer one was flushed on entry
        opforge.rmsnorm(x, w)
        opforge.rmsnorm(x, w)
    assert not inner.active and intercept.tracer() is outer
    assert len(workloads(tmp_path / "inner", NORM)) == 2  # written when the block ended
    opforge.rmsnorm(x, w)
    disable_tracing()
    assert not outer.active and intercept.tracer() is None and not _hooks.active
    assert len(workloads(tmp_path / "outer", NORM)) == 2
    opforge.rmsnorm(x, w)  # off: nothing more
    assert len(workloads(tmp_path / "outer", NORM)) == 2
    outer.close()  # closing twice is harmless and says nothing more
    err = capsys.readouterr().err
    assert err.count("opforge tracing: ") == 4  # two summaries of two lines each
    assert f"{NORM}: 2 calls, 2 workloads kept, 2 payloads dumped, 0 dropped" in err


def test_disable_closes_every_tracing_and_closing_out_of_order_keeps_the_rest(tmp_path, rng):
    x, w = rng.randn(2, H), rng.randn(H)
    a = enable_tracing(dataset_dir=tmp_path / "a", tracing_configs=ALL)
    b = enable_tracing(dataset_dir=tmp_path / "b", tracing_configs=ALL)
    a.close()  # not the innermost: b keeps recording
    assert intercept.tracer() is b
    opforge.rmsnorm(x, w)
    c = enable_tracing(dataset_dir=tmp_path / "c", tracing_configs=ALL)
    disable_tracing()
    assert not (a.active or b.active or c.active) and intercept.tracer() is None
    assert len(workloads(tmp_path / "b", NORM)) == 1


def test_an_unwritable_folder_warns_and_leaves_tracing_off(tmp_path, rng):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    x, w = rng.randn(2, H), rng.randn(H)
    with pytest.warns(RuntimeWarning, match=r"cannot write to the dataset folder .*a-file/ds.*tracing is off"):
        tracer = enable_tracing(dataset_dir=blocker / "ds")
    assert not tracer.active and intercept.tracer() is None and not _hooks.active
    with tracer:
        y = opforge.rmsnorm(x, w)
    assert torch.equal(y, opforge.rmsnorm(x, w, backend="torch"))


def test_failing_calls_never_reach_the_model(tmp_path, rng, capsys):
    class Broken(GatherCall):
        @property
        def inputs(self):
            raise RuntimeError("inputs unavailable")

        @inputs.setter
        def inputs(self, value):
            pass

    args = (rng.randn(5, 8), torch.tensor([1], dtype=torch.int32), 0.5)
    with enable_tracing(dataset_dir=tmp_path / "ds") as tracer:
        with pytest.warns(RuntimeWarning, match="recording a call of gather_rows_h8: RuntimeError: inputs unavailable"):
            record(Broken(*args))
        for _ in range(3):
            record(Broken(*args))  # counted, not said again
        record(object())  # not a call at all
    err = capsys.readouterr().err
    assert "5 calls could not be recorded (first: gather_rows_h8: RuntimeError: inputs unavailable)" in err
    assert tracer.stats()[GATHER.name]["kept"] == 0
    record(Broken(*args))  # tracing off: nothing happens


def _signal_inside(monkeypatch, signum):
    """Every Workload the tracer builds raises `signum` from inside a finalizer first: Python runs
    the handler right there, where an exception it raises is discarded ("Exception ignored in"),
    as it is under pydantic's validation."""
    class Finalized:
        def __del__(self):
            signal.raise_signal(signum)

    real = tracer_module.Workload

    def workload(*args, **kwargs):
        Finalized()  # collected at once: its __del__ runs here
        return real(*args, **kwargs)

    monkeypatch.setattr(tracer_module, "Workload", workload)


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or threading.current_thread() is not threading.main_thread(),
                    reason="needs SIGTERM and the main thread")
@pytest.mark.parametrize("calls, raises", [(1, SystemExit(3)), (3, SystemExit(3)), (1, RuntimeError("stop"))])
def test_a_signal_during_a_recording_is_handled_when_it_is_done(tmp_path, rng, monkeypatch, calls, raises):
    ran = []

    def mine(signum, frame):
        ran.append(signum)
        raise raises  # whatever the handler raises reaches the caller, not the recording's failure count

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL)
        w = rng.randn(H)
        for i in range(calls - 1):  # calls before the signal go through untouched
            opforge.rmsnorm(rng.randn(i + 1, H), w)
        _signal_inside(monkeypatch, signal.SIGTERM)
        x = rng.randn(7, H)
        with pytest.raises(type(raises)) as exc:
            opforge.rmsnorm(x, w)
        # The handler ran once, after the recording (not inside it, where its exit was lost),
        # and after tracing flushed: the interrupted call's workload is on disk.
        assert exc.value is raises and ran == [signal.SIGTERM]
        assert current_tracer().stats()[NORM]["kept"] == calls
        kept = workloads(tmp_path / "ds", NORM)
        assert [wl.axes["batch_size"] for wl in kept] == [*range(1, calls), 7]
        monkeypatch.undo()
        opforge.rmsnorm(rng.randn(2, H), w)  # nothing left over: the next call records as usual
        assert ran == [signal.SIGTERM]
    finally:
        disable_tracing()
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread(),
                    reason="needs SIGUSR1/SIGUSR2 and the main thread")
def test_signals_noted_in_a_recording_are_raised_again_after_it_in_order(monkeypatch):
    from opforge.tracing import deferral

    order = []

    def handler(signum, frame):
        order.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGUSR1 else SystemExit(5)

    def later(signum, frame):  # the handler installed when the recording ends is the one that runs
        order.append(("later", signum))

    previous = {s: signal.signal(s, handler) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        with pytest.raises(KeyboardInterrupt):
            with deferral.Recording():
                with deferral.Recording():  # nested: only the outermost raises them
                    assert deferral.defer(signal.SIGUSR1) and deferral.defer(signal.SIGUSR2)
                assert order == []
        assert order == [signal.SIGUSR1, signal.SIGUSR2]  # both ran; the first exception left
        order.clear()
        with deferral.Recording():
            assert deferral.defer(signal.SIGUSR2)
            signal.signal(signal.SIGUSR2, later)
        assert order == [("later", signal.SIGUSR2)]
        assert not deferral.defer(signal.SIGUSR1)  # outside a recording: handle it now
        done = []
        worker = threading.Thread(target=lambda: done.append(deferral.Recording().__enter__()))
        worker.start()
        worker.join()
        assert done == [None] and not deferral.defer(signal.SIGUSR1)  # other threads do not defer
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_calls_that_do_not_fit_their_definition_are_skipped_and_the_op_reports_them(tmp_path, rng):
    x, w = rng.randn(2, H), rng.randn(H + 1)  # a weight of the wrong size
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL) as tracer:
        with pytest.raises(ValueError):
            opforge.rmsnorm(x, w)
    assert tracer.stats()[NORM]["unfit"] == 1 and tracer.stats()[NORM]["kept"] == 0
    assert load(tmp_path / "ds").get_workloads(NORM) == []


# --- Definition files already in the folder --------------------------------------------------


def _definition_file(root: Path) -> Path:
    return root / "definitions" / "rmsnorm" / f"{NORM}.json"


def _write_definition(root: Path, definition) -> Path:
    path = _definition_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(definition.to_json())
    return path


def test_an_existing_definition_with_the_same_inputs_is_kept_and_traced_into(tmp_path, rng, capsys):
    ours = definition_for_name(NORM)
    theirs = ours.model_copy(update={"description": "hand-written notes",
                                     "reference": ours.reference.replace("@torch.no_grad()\n", "")})
    path = _write_definition(tmp_path / "ds", theirs)
    before = path.read_bytes()
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL):
        opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    assert path.read_bytes() == before
    assert len(workloads(tmp_path / "ds", NORM)) == 1
    assert "differs from the Definition opforge makes" in capsys.readouterr().err
    assert not (tmp_path / "ds" / "solutions").exists()  # not ours: no solution added to it


def test_a_conflicting_definition_is_left_alone_and_not_traced(tmp_path, rng):
    ours = definition_for_name(NORM)
    inputs = dict(ours.inputs)
    del inputs["eps"]
    theirs = ours.model_copy(update={"inputs": inputs, "reference": "def run(hidden_states, weight):\n    pass\n"})
    path = _write_definition(tmp_path / "ds", theirs)
    before = path.read_bytes()
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL) as tracer:
        with pytest.warns(RuntimeWarning, match=f"holds a different Definition .* {NORM} is not traced"):
            opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
        opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    assert path.read_bytes() == before
    assert tracer.stats()[NORM]["calls"] == 2 and tracer.stats()[NORM]["kept"] == 0
    assert not (tmp_path / "ds" / "workloads").exists()


def test_tracing_again_into_the_same_folder_adds_to_it(tmp_path, rng):
    for _ in range(2):
        with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL):
            opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    assert len(workloads(tmp_path / "ds", NORM)) == 2
    assert len(list((tmp_path / "ds" / "definitions").rglob("*.json"))) == 1


# --- a full queue, torn files, graph capture ---------------------------------------------------


class BlockedWriter:
    """Holds the writer thread at its first blob until released."""

    def __init__(self, monkeypatch):
        self.release = threading.Event()
        self.started = threading.Event()
        save = dataset_module.DatasetFolder.save_blob

        def blocked(folder, *args):
            self.started.set()
            assert self.release.wait(30)
            return save(folder, *args)

        monkeypatch.setattr(dataset_module.DatasetFolder, "save_blob", blocked)


def test_a_full_queue_drops_and_counts_and_memory_stays_bounded(tmp_path, rng, monkeypatch, capsys):
    blocked = BlockedWriter(monkeypatch)
    w = rng.randn(H)
    payload = (4 * H + H) * 4  # hidden_states [4, H] + weight, float32
    peak = []
    reserve = tracer_module.Writer.reserve

    def watched(writer, nbytes):
        ok = reserve(writer, nbytes)
        peak.append(writer.pending_bytes)
        return ok

    monkeypatch.setattr(tracer_module.Writer, "reserve", watched)
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL, max_pending_workloads=50,
                        max_pending_bytes=int(2.5 * payload)) as tracer:
        xs = [rng.randn(4, H) for _ in range(20)]
        for x in xs:
            opforge.rmsnorm(x, w)
        assert blocked.started.wait(10)
        blocked.release.set()
    stats = tracer.stats()[NORM]
    # The item being written holds its bytes until it is on disk: one more fits the budget.
    assert stats["kept"] == 2 and stats["dropped"] == 18 and stats["written"] == 2
    assert max(peak) <= 2.5 * payload
    ts = load(tmp_path / "ds")
    saved = [t.workload for t in ts.get_workloads(NORM)]
    assert [torch.equal(ts.load_input_tensor(NORM, s, "hidden_states"), x) for s, x in zip(saved, xs)] == [True] * 2
    err = capsys.readouterr().err
    assert "18 workloads dropped: the write queue was full (at most 50 workloads and 4.69 KiB pending)" in err
    assert f"{NORM}: 20 calls, 2 workloads kept, 2 payloads dumped, 18 dropped" in err


def test_a_dropped_shape_is_kept_at_its_next_call(tmp_path, rng, monkeypatch):
    blocked = BlockedWriter(monkeypatch)
    w = rng.randn(H)
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs={NORM: TracingConfig("dump_all")},
                        max_pending_workloads=1) as tracer:
        opforge.rmsnorm(rng.randn(3, H), w)
        assert blocked.started.wait(10)
        opforge.rmsnorm(rng.randn(5, H), w)  # no room: dropped, and not marked as seen
        assert tracer.stats()[NORM]["dropped"] == 1
        blocked.release.set()
        tracer.flush()
        opforge.rmsnorm(rng.randn(5, H), w)
        opforge.rmsnorm(rng.randn(5, H), w)
    assert [s.axes["batch_size"] for s in workloads(tmp_path / "ds", NORM)] == [3, 5]


def test_a_torn_last_line_is_cut_before_appending_and_a_whole_one_is_kept(tmp_path, rng, capsys):
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL):
        opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    lines = tmp_path / "ds" / "workloads" / "rmsnorm" / f"{NORM}.jsonl"
    first = lines.read_text()
    by_hand = json.loads(first)
    by_hand["workload"]["uuid"] = "written-by-hand"
    lines.write_text(first + json.dumps(by_hand))  # a whole line without its newline: kept
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL):
        opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    assert [w.uuid for w in workloads(tmp_path / "ds", NORM)][1] == "written-by-hand"
    assert len(lines.read_text().splitlines()) == 3
    lines.write_text(first + first[: len(first) // 2])  # a kill in the middle of a write
    with pytest.raises(Exception, match="malformed JSON"):
        load(tmp_path / "ds")
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL):
        opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    assert "cut off a torn last line" in capsys.readouterr().err
    assert len(workloads(tmp_path / "ds", NORM)) == 2


def test_during_graph_capture_only_shapes_are_recorded(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(tracer_module, "capturing", lambda tensors: True)
    with enable_tracing(dataset_dir=tmp_path / "ds", tracing_configs=ALL) as tracer:
        opforge.rmsnorm(rng.randn(2, H), rng.randn(H))
    (workload,) = workloads(tmp_path / "ds", NORM)
    assert kinds(workload) == {"hidden_states": "random", "weight": "random", "eps": "scalar"}
    assert tracer.stats()[NORM]["dumped"] == 0 and not (tmp_path / "ds" / "blob").exists()
