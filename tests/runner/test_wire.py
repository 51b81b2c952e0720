"""What the runner accepts from a worker, byte by byte and field by field: messages that cannot
run code, tensors whose sizes add up, spill files only where they belong, call records and
timings a real worker makes, and timings that fit the runner's clock."""

from __future__ import annotations

import json
import os
import pickle
import struct

import pytest
import torch

from opforge.bench import CallRecord, Settings, _wire
from opforge.bench.performance import checked_timing, clock_problem, performance, spread_problem
from opforge.trace.templates import TEMPLATES


def _message(header, *buffers) -> bytes:
    head = json.dumps(header).encode()
    out = _wire.MAGIC + struct.pack("<Q", len(head)) + head
    for b in buffers:
        out += struct.pack("<Q", len(b)) + b
    return out


def test_plain_data_and_tensors_round_trip():
    msg = {"a": (1, 2.5, "x", None, True), "b": [b"raw", float("nan"), float("-inf")], "t": torch.arange(6.0).view(2, 3)}
    got = _wire.loads(_wire.dumps(msg))
    assert got["a"] == (1, 2.5, "x", None, True) and isinstance(got["a"], tuple)
    assert got["b"][0] == b"raw" and got["b"][1] != got["b"][1] and got["b"][2] == float("-inf")
    assert torch.equal(got["t"], msg["t"])


class Payload:
    def __reduce__(self):
        return (os.system, ("echo unpickled",))


@pytest.mark.parametrize("value", [Payload(), {"k": Payload()}, {1: "int key"}, {"~": "tag"}, torch.tensor([1]).to_sparse(),
                                   object(), lambda: 0], ids=["object", "nested", "int-key", "tag-key", "sparse",
                                                             "plain-object", "function"])
def test_only_plain_data_and_tensors_can_be_sent(value):
    with pytest.raises((TypeError, RuntimeError)):
        _wire.dumps({"reply": value})


BAD_MESSAGES = {
    "a pickle": pickle.dumps({"records": [], "x": Payload()}),
    "empty": b"",
    "garbage": b"\x00" * 64,
    "truncated header": _wire.MAGIC + struct.pack("<Q", 1000) + b"{}",
    "header not JSON": _message({"a": 1}).replace(b'{"a": 1}', b"{'a': 1}"),
    "unknown tag": _message({"~": "object", "module": "os", "name": "system"}),
    "dtype not on the list": _message({"~": "tensor", "dtype": "__class__", "shape": [1], "buffer": 0}, b"\0" * 8),
    "dtype of torch but not data": _message({"~": "tensor", "dtype": "qint8", "shape": [1], "buffer": 0}, b"\0"),
    "size mismatch": _message({"~": "tensor", "dtype": "float32", "shape": [4], "buffer": 0}, b"\0" * 8),
    "huge shape": _message({"~": "tensor", "dtype": "float32", "shape": [2**40, 2**40], "buffer": 0}, b"\0" * 8),
    "negative shape": _message({"~": "tensor", "dtype": "float32", "shape": [-2], "buffer": 0}, b"\0" * 8),
    "bad buffer index": _message({"~": "tensor", "dtype": "uint8", "shape": [1], "buffer": 5}, b"\0"),
    "buffer index bool": _message({"~": "bytes", "buffer": True}, b"\0"),
    "deep nesting": _wire.MAGIC + struct.pack("<Q", 20001) + b"[" * 10000 + b"1" + b"]" * 10000,
}


@pytest.mark.parametrize("data", BAD_MESSAGES.values(), ids=BAD_MESSAGES.keys())
def test_malformed_messages_are_refused_without_running_anything(data, capfd):
    with pytest.raises(_wire.WireError):
        _wire.loads(data)
    assert "unpickled" not in capfd.readouterr().out


def test_spill_files_are_read_only_from_the_spill_folder(tmp_path):
    spill, outside = tmp_path / "spill", tmp_path / "outside"
    spill.mkdir(), outside.mkdir()
    secret = outside / "secret.bin"
    secret.write_bytes(b"\1" * 16)
    tensor = {"~": "tensor", "dtype": "uint8", "shape": [16]}
    for name in ("../outside/secret.bin", str(secret), "secret.bin", "0" * 32 + ".bin/.."):
        with pytest.raises(_wire.WireError, match="bad spill file"):
            _wire.loads(_message(dict(tensor, file=name)), spill)
    link = spill / ("a" * 32 + ".bin")
    link.symlink_to(secret)
    with pytest.raises(_wire.WireError, match="spill file"):
        _wire.loads(_message(dict(tensor, file=link.name)), spill)
    assert secret.read_bytes() == b"\1" * 16  # followed nowhere, removed nothing outside
    wrong_size = spill / ("b" * 32 + ".bin")
    wrong_size.write_bytes(b"\0" * 15)
    with pytest.raises(_wire.WireError, match="15 bytes"):
        _wire.loads(_message(dict(tensor, file=wrong_size.name)), spill)
    with pytest.raises(_wire.WireError, match="bad spill file"):  # no spill folder: no files at all
        _wire.loads(_message(dict(tensor, file=wrong_size.name)))


def test_call_records_are_checked_field_by_field():
    good = CallRecord(outputs=(torch.ones(2), ), changed=["x"], shared=[("y", "input", "x")]).to_wire()
    back = CallRecord.from_wire(_wire.loads(_wire.dumps(good)))
    assert back.changed == ["x"] and back.shared == [("y", "input", "x")] and torch.equal(back.outputs[0], torch.ones(2))
    assert CallRecord(outputs=(Payload(), 3)).to_wire()["outputs"] == ("Payload", "int")
    for bad in ([], {"outputs": None}, dict(good, outputs=[torch.ones(1)]), dict(good, outputs=({"a": 1},)),
                dict(good, changed="x"), dict(good, shared=[["y", "input"]]), dict(good, error=3), dict(good, extra=1)):
        with pytest.raises(ValueError):
            CallRecord.from_wire(bad)


def _timing(median=0.01, n=100, **kw):
    t = dict(median_ms=median, p10_ms=median * 0.9, p90_ms=median * 1.1, min_ms=median * 0.8, max_ms=median * 1.5,
             stdev_ms=median * 0.1, iterations=n, method="cuda_events", spin_lead_us=20.0)
    t.update(kw)
    return t


def test_timings_are_checked_field_by_field():
    s = Settings(iterations=100)
    assert checked_timing(dict(_timing(), injected="<script>"), s).keys() == _timing().keys()
    for bad in ("fast", None, _timing(median_ms="0.1"), _timing(median_ms=float("nan")), _timing(min_ms=-1.0),
                _timing(n=101), _timing(n=3), _timing(n=True), _timing(p10_ms=5.0), _timing(method=7),
                _timing(graph_ms=float("inf"))):
        with pytest.raises(ValueError):
            checked_timing(bad, s)


def test_a_timing_must_fit_the_runners_clock():
    s = Settings(iterations=100, max_time_s=2.0)
    # 100 timed calls, each with a timed empty call beside it, both behind a 20 us spin: >= 4 ms.
    fake = checked_timing(_timing(0.004), s)
    assert "does not fit the runner's clock" in clock_problem(fake, 0.0005, s, cuda=True)
    assert clock_problem(fake, 0.050, s, cuda=True) is None
    # 100 calls of 10 ms cannot finish in 0.2 s, on any device.
    slow = checked_timing(_timing(10.0), s)
    assert clock_problem(slow, 0.2, s, cuda=False) and clock_problem(slow, 1.2, s, cuda=False) is None
    # Fewer calls than asked only when the budget ran out.
    early = checked_timing(_timing(0.01, n=30), s)
    assert "30 of 100 calls" in clock_problem(early, 0.5, s, cuda=False)
    assert clock_problem(early, 2.1, s, cuda=False) is None
    # The loop without the spin lead reports up to 20 calls, in a quarter of the budget.
    bare = checked_timing(_timing(0.01, n=20, method="cuda_events+device_synchronize, no lead"), s)
    assert clock_problem(bare, 0.01, s, cuda=True) is None


def test_high_spread_is_suspect_and_never_a_baseline_ratio_worth_trusting():
    s = Settings()
    assert spread_problem(_timing(), s) is None
    busy = _timing(0.1, p10_ms=0.01, p90_ms=0.36, max_ms=20.3)
    assert spread_problem(busy, s).startswith("high spread: p90/p10 36.0x, max/median 203x")
    assert spread_problem(dict(busy, iterations=10), s) is None  # too few calls to judge
    norm = TEMPLATES["rmsnorm"].definition(dtype="bfloat16", hidden_size=4096)
    axes = {"batch_size": 256, "hidden_size": 4096}
    perf = performance(norm, axes, busy, {"gbps": 3000.0}, s, reference_ms=1.0, baseline="b", baseline_ms=0.7,
                       clock="timing does not fit the runner's clock: x")
    assert perf.suspect.splitlines()[0].startswith("timing does not fit")
    assert perf.suspect.splitlines()[1].startswith("high spread")


@pytest.mark.parametrize("shape, order", [((5, 6, 3), [2, 0, 1]), ((4, 1, 7), [2, 0, 1]), ((300, 1200), [1, 0]),
                                          ((2, 3, 4, 5), [3, 1, 0, 2])], ids=str)
def test_permuted_dense_tensors_keep_their_memory_layout(tmp_path, shape, order):
    """A permuted contiguous tensor (how a kernel's callers may lay out an operand) arrives with
    the same strides, inline or through a spill file (the 300 x 1200 fp32 one is over the
    spill size); other strided tensors arrive contiguous with the same values."""
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    base = torch.randn([shape[d] for d in order])
    sent = base.permute(*inverse)
    assert sent.shape == shape
    strided = torch.randn(shape[0] * 2, *shape[1:])[::2]
    for spill in (None, tmp_path):
        got, got_strided = _wire.loads(_wire.dumps([sent, strided], spill=spill), spill=spill)
        assert got.stride() == sent.stride() and torch.equal(got, sent)
        assert got_strided.is_contiguous() and torch.equal(got_strided, strided)


@pytest.mark.parametrize("order", [[0, 0], [0, 2], [1], "01", [True, 0]], ids=str)
def test_a_malformed_dimension_order_is_refused(order):
    msg = _message({"~": "tensor", "dtype": "float32", "shape": [2, 3], "buffer": 0, "order": order}, bytes(24))
    with pytest.raises(_wire.WireError, match="dimension order"):
        _wire.loads(msg)
