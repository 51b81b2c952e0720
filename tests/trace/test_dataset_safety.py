"""A dataset stays inside its folder, and hostile or careless files cannot take a load or a save
elsewhere: blob paths out of the folder, symbolic links, huge or sparse files, names no file
system accepts, integers torch cannot hold, and writes that fail half way."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from opforge.trace import (AxisConst, BlobError, DatasetPathError, Definition, LoadError, RandomInput,
                           SafetensorsInput, ScalarInput, SchemaError, TraceSet, Workload, load_safetensors_input,
                           save_safetensors_blob, workload_blob_relpath)
from opforge.trace import _io
from test_traceset import dataset  # noqa: F401 (a fixture)
from test_traceset import BLOB, DEF, WL, make_definition, make_solution, make_trace, make_workload, populated, snapshot

TRACES = "traces/alice/rmsnorm/rmsnorm_h4096.jsonl"
WL_H4096 = "workloads/rmsnorm/rmsnorm_h4096.jsonl"


def set_blob_path(root: Path, path: str) -> None:
    """Point the second workload of rmsnorm_d128 (line 2) at ``path`` for its ``input``."""
    lines = (root / WL).read_text().splitlines()
    data = json.loads(lines[1])
    data["workload"]["inputs"]["input"]["path"] = path
    lines[1] = json.dumps(data)
    (root / WL).write_text("\n".join(lines) + "\n")


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")} if folder.exists() else set()


# --- blob paths leaving the dataset -------------------------------------------------------


@pytest.mark.parametrize("escape", ["../outside/x.safetensors", "../../outside/x.safetensors", "absolute"])
def test_blob_paths_out_of_the_dataset_are_load_errors(dataset, tmp_path, escape):
    root = tmp_path / "deep" / "dataset"  # so that both escapes land in tmp_path
    root.parent.mkdir()
    shutil.move(str(dataset), root)
    outside = (root / escape).parent if escape != "absolute" else tmp_path / "outside"
    outside.mkdir()
    shutil.copy(root / BLOB, outside / "x.safetensors")  # a valid blob: only its place is wrong
    set_blob_path(root, str(outside / "x.safetensors") if escape == "absolute" else escape)
    ts = TraceSet.from_path(root)
    errors = [e for e in ts.load_errors if e.path == WL]
    assert [(e.line, e.field) for e in errors] == [(2, "workload.inputs.input.path")], ts.load_errors
    assert "must be relative" in errors[0].message or "must not contain '..'" in errors[0].message
    assert [t.workload.uuid for t in ts.get_workloads("rmsnorm_d128")] == ["a1b2c3d4-0001"]
    with pytest.raises(LoadError, match=r"rmsnorm_d128.jsonl:2: workload.inputs.input.path"):
        TraceSet.from_path(root, strict=True)
    # saving elsewhere writes nothing beside the target folder
    ts.save(tmp_path / "save" / "x" / "other")
    assert all(p.startswith("x/other") or p == "x" for p in files_under(tmp_path / "save"))
    assert files_under(outside) == {"x.safetensors"}


def test_blob_paths_out_of_the_dataset_are_refused_when_built():
    for bad in ("../../outside/x.safetensors", "/etc/passwd", "blob/../../x.safetensors", "blob//x", "a\0b"):
        with pytest.raises(SchemaError) as info:
            Workload(uuid="u", axes={}, inputs={"x": {"type": "safetensors", "path": bad, "tensor_key": "x"}})
        assert info.value.field == "inputs.x.path", bad


def test_blob_folder_linked_out_of_the_dataset(dataset, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(dataset / "blob"), elsewhere)
    (dataset / "blob").symlink_to(elsewhere, target_is_directory=True)
    ts = TraceSet.from_path(dataset)
    errors = [e for e in ts.load_errors if e.path == WL]
    assert [(e.line, e.field) for e in errors] == [(2, "workload.inputs.input")]
    assert errors[0].message.startswith(f"safetensors path refused: blob (in {BLOB}) is a symbolic link "
                                        f"(to {elsewhere})")
    # loaded without checking blobs, the tensor is still not read through the link
    ts = TraceSet.from_path(dataset, check_blobs=False)
    w = ts.get_workloads("rmsnorm_d128")[1].workload
    with pytest.raises(BlobError, match="symbolic link"):
        ts.load_input_tensor("rmsnorm_d128", w, "input")
    # nor copied from it: the save is refused before anything is written
    with pytest.raises(BlobError, match="symbolic link"):
        ts.save(tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_blobs_are_not_written_out_of_the_dataset(tmp_path):
    import torch

    root, outside = tmp_path / "ds", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "blob").symlink_to(outside, target_is_directory=True)
    for relative in ("blob/x.safetensors", "../outside/y.safetensors", str(outside / "z.safetensors")):
        with pytest.raises(BlobError, match="refused"):
            save_safetensors_blob(root, relative, {"x": torch.ones(2)})
    assert files_under(outside) == set()
    with pytest.raises(BlobError, match="refused"):
        load_safetensors_input(root, SafetensorsInput.model_construct(path="../outside/y.safetensors",
                                                                      tensor_key="x"))


# --- symbolic links ---------------------------------------------------------------------------


def test_linked_traces_file_is_reported_once_and_never_appended_to(dataset, tmp_path, caplog):
    victim = tmp_path / "victim.jsonl"
    shutil.move(str(dataset / TRACES), victim)
    (dataset / TRACES).symlink_to(victim)
    before = victim.read_bytes()
    with caplog.at_level(logging.WARNING, logger="opforge.trace"):
        ts = TraceSet.from_path(dataset)
    errors = [e for e in ts.load_errors if e.path == TRACES]
    assert len(errors) == 1 and errors[0].line is None and "symbolic link" in errors[0].message
    assert len([r for r in caplog.records if TRACES in r.getMessage()]) == 1
    assert ts.get_traces("rmsnorm_h4096") == []  # nothing read through the link
    trace = ts.get_workloads("rmsnorm_h4096")[0].model_copy(update={
        "solution": "rmsnorm_h4096_torch", "evaluation": make_trace().evaluation})
    with pytest.raises(DatasetPathError, match=f"{TRACES} is a symbolic link"):
        ts.add_trace(trace, persist=True)
    assert ts.get_traces("rmsnorm_h4096") == []  # a refused append leaves the set as it was
    ts.add_trace(trace)
    unchanged = snapshot(dataset)
    with pytest.raises(DatasetPathError, match="symbolic link"):
        ts.save()
    assert victim.read_bytes() == before and snapshot(dataset) == unchanged  # the save wrote nothing


@pytest.mark.parametrize("linked", ["definitions", "solutions/alice", "workloads/rmsnorm"])
def test_linked_folder_is_reported_once_and_not_entered(dataset, tmp_path, linked):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(dataset / linked), elsewhere)
    (dataset / linked).symlink_to(elsewhere, target_is_directory=True)
    before = files_under(elsewhere)
    ts = TraceSet.from_path(dataset, check_blobs=False)
    here = [e for e in ts.load_errors if e.path.startswith(linked)]
    assert [(e.path, e.field) for e in here] == [(linked, None)] and "symbolic link" in here[0].message
    if linked == "workloads/rmsnorm":
        assert ts.get_workloads("rmsnorm_h4096") == []
        workload = Workload(uuid="new", axes={"batch_size": 3},
                            inputs={"hidden_states": RandomInput(), "weight": RandomInput()})
        with pytest.raises(DatasetPathError, match="workloads/rmsnorm .*is a symbolic link"):
            ts.add_workload("rmsnorm_h4096", workload, persist=True)
        ts.add_workload("rmsnorm_h4096", workload)
        with pytest.raises(DatasetPathError, match="workloads/rmsnorm .*is a symbolic link"):
            ts.save()
    assert files_under(elsewhere) == before


def test_links_inside_the_dataset_are_not_followed_either(dataset):
    (dataset / "definitions/rmsnorm/alias.json").symlink_to("rmsnorm_h4096.json")
    ts = TraceSet.from_path(dataset)
    assert [(e.path, e.field) for e in ts.load_errors] == [("definitions/rmsnorm/alias.json", None)]
    assert "not followed" in ts.load_errors[0].message
    assert "rmsnorm_h4096" in ts.definitions


def test_saving_into_a_folder_with_a_link_out_writes_nothing(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "traces").symlink_to(outside, target_is_directory=True)
    with pytest.raises(DatasetPathError, match=r"^traces \(in traces/.*\) is a symbolic link"):
        populated().save(out)
    assert files_under(outside) == set() and files_under(out) == {"traces"}


def test_fifo_named_like_a_dataset_file_is_skipped(dataset):
    pipe = dataset / "workloads/rmsnorm/pipe.jsonl"
    os.mkfifo(pipe)  # opening it to read would block until someone writes
    loaded: list[TraceSet] = []
    reader = threading.Thread(target=lambda: loaded.append(TraceSet.from_path(dataset)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader see an end
        pytest.fail("loading blocked on a FIFO")
    assert [(e.path, e.message) for e in loaded[0].load_errors] == [
        ("workloads/rmsnorm/pipe.jsonl", "is not a regular file (skipped)")]


# --- huge and sparse files --------------------------------------------------------------------


def test_huge_sparse_files_are_reported_without_being_read(dataset):
    """1 GiB sparse files as a definition, a workloads file and two blobs: each is reported (or,
    for the blob with a valid header, checked) while memory stays far below their size."""
    lines = (dataset / WL).read_text().splitlines()
    third = json.loads(lines[1])
    third["workload"]["uuid"] = "a1b2c3d4-0003"
    third["workload"]["inputs"]["input"]["path"] = "blob/zeros.safetensors"
    (dataset / WL).write_text("\n".join(lines + [json.dumps(third)]) + "\n")
    (dataset / "blob/zeros.safetensors").touch()
    for name in ("definitions/rmsnorm/huge.json", "workloads/rmsnorm/huge.jsonl", "blob/zeros.safetensors", BLOB):
        with open(dataset / name, "r+b" if (dataset / name).exists() else "wb") as f:
            f.truncate(1 << 30)  # BLOB keeps its valid header in front of a sparse tail
    script = textwrap.dedent(f"""
        import json, resource, time
        from opforge.trace import TraceSet
        start, rss = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ts = TraceSet.from_path({str(dataset)!r})
        print(json.dumps({{"seconds": time.monotonic() - start,
                           "grew_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss,
                           "errors": [[e.path, e.line, e.message] for e in ts.load_errors],
                           "workloads": len(ts.get_workloads("rmsnorm_d128"))}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["grew_kib"] < 200 * 1024, result
    assert result["seconds"] < 30, result
    errors = {(path, line): message for path, line, message in result["errors"]}
    assert set(errors) == {("definitions/rmsnorm/huge.json", None), ("workloads/rmsnorm/huge.jsonl", 1),
                           (WL, 3)}, errors
    assert errors["definitions/rmsnorm/huge.json", None] == (
        f"the file is {1 << 30} bytes, more than the {_io.MAX_RECORD_BYTES} read (opforge.trace._io.MAX_RECORD_BYTES)")
    assert errors["workloads/rmsnorm/huge.jsonl", 1].startswith(f"the line is {1 << 30} bytes, more than the")
    assert "implausible header length 0" in errors[WL, 3]
    assert result["workloads"] == 2  # the big blob's header fits, so its workload loads


def test_record_limit_is_a_module_constant(dataset, monkeypatch):
    lines = (dataset / WL_H4096).read_text().splitlines()
    padded = json.loads(lines[0])
    padded["workload"]["note"] = "x" * 5000
    (dataset / WL_H4096).write_text("\n".join([json.dumps(padded), lines[1]]) + "\n")
    monkeypatch.setattr(_io, "MAX_RECORD_BYTES", 4000)
    ts = TraceSet.from_path(dataset)
    assert [(e.line, e.field) for e in ts.load_errors if e.path == WL_H4096] == [(1, None)]
    assert len(ts.get_workloads("rmsnorm_h4096")) == 1  # the line after the long one still loads
    monkeypatch.setattr(_io, "MAX_RECORD_BYTES", 500)
    ts = TraceSet.from_path(dataset)
    assert any(e.path == DEF and e.line is None and "more than the 500" in e.message for e in ts.load_errors)


def test_oversized_blob_header_is_refused_unread(tmp_path, monkeypatch):
    from opforge.trace import read_safetensors_header

    path = tmp_path / "x.safetensors"
    path.write_bytes((90 << 20).to_bytes(8, "little"))
    with open(path, "r+b") as f:
        f.truncate(1 << 30)  # room for the 90 MiB the header claims, all zeros
    with pytest.raises(ValueError, match="more than the"):
        read_safetensors_header(path)
    path.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="implausible header length"):
        read_safetensors_header(path)


# --- names that cannot be file names --------------------------------------------------------


@pytest.mark.parametrize("build, field", [
    (lambda: make_definition(name="d" * 300), "name"),
    (lambda: make_definition(name="d" * 250), "name"),  # 250 + ".jsonl" is 256 bytes
    (lambda: make_definition(name="é" * 125), "name"),  # 125 characters, 250 bytes in UTF-8
    (lambda: make_definition(name="a\0b"), "name"),
    (lambda: make_definition(name=".."), "name"),
    (lambda: make_definition(name="a/b"), "name"),
    (lambda: Definition.from_dict({**make_definition().to_dict(), "op_type": "o" * 256}), "op_type"),
    (lambda: make_solution(name="s" * 251), "name"),
    (lambda: make_solution(author="a" * 256), "author"),
    (lambda: make_solution(definition="d" * 250), "definition"),
    (lambda: make_workload(uuid="u" * 300), "uuid"),
    (lambda: make_workload(uuid="../../x"), "uuid"),
    (lambda: make_workload(uuid="a\0b"), "uuid"),
])
def test_names_a_file_system_refuses_are_refused_at_validation(build, field):
    with pytest.raises(SchemaError) as info:
        build()
    assert info.value.field == field, str(info.value)


def test_longest_names_save_and_load(tmp_path):
    name = "d" * 249  # with ".jsonl", exactly 255 bytes
    ts = TraceSet()
    ts.add_definition(Definition.from_dict({**make_definition(name=name).to_dict(), "op_type": "o" * 255}))
    ts.add_solution(make_solution(name="s" * 250, definition=name, author="a" * 255))
    ts.add_workload(name, make_workload(uuid="u" * 243))  # with ".safetensors", 255 bytes
    ts.save(tmp_path / "ds")
    loaded = TraceSet.load(tmp_path / "ds")
    assert loaded.load_errors == [] and loaded.get_solution("s" * 250).author == "a" * 255
    assert loaded.get_workloads(name)[0].workload.uuid == "u" * 243


def test_loading_a_definition_with_a_too_long_name(dataset):
    data = json.loads((dataset / DEF).read_text())
    data["name"] = "n" * 300
    (dataset / DEF).write_text(json.dumps(data))
    ts = TraceSet.from_path(dataset)
    assert any(e.path == DEF and e.field == "name" and "too long" in e.message for e in ts.load_errors)


def test_blob_name_too_long_for_the_definition():
    with pytest.raises(ValueError, match="too long"):
        workload_blob_relpath("rmsnorm", "d" * 200, "u" * 60)


# --- whole-file writes and fsync --------------------------------------------------------------


def hidden_or_temporary(root: Path) -> list[str]:
    return sorted(p for p in files_under(root) if p.endswith(".tmp") or "/." in f"/{p}")


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_save_leaves_no_temporary_files(dataset, tmp_path, monkeypatch, failing):
    ts = TraceSet.from_path(dataset)
    ts.get_definition("rmsnorm_h4096").tags.append("edited")
    before = snapshot(dataset)

    def fail(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="Input/output error"):
        ts.save()
    with pytest.raises(OSError, match="Input/output error"):
        ts.save(tmp_path / "copy")  # copies the unchanged files first
    with pytest.raises(OSError, match="Input/output error"):
        populated().save(tmp_path / "single.json")
    monkeypatch.undo()
    assert snapshot(dataset) == before
    assert hidden_or_temporary(dataset) == [] and hidden_or_temporary(tmp_path) == []


def test_writes_and_appends_are_fsynced(dataset, tmp_path, monkeypatch):
    synced: set[int] = set()
    real = os.fsync

    def record(fd):
        synced.add(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    ts = TraceSet.from_path(dataset)
    ts.get_definition("rmsnorm_h4096").tags.append("edited")
    ts.save()
    ts.save(tmp_path / "copy")
    copy = tmp_path / "copy"
    for path in (dataset / DEF, (dataset / DEF).parent, copy / TRACES, (copy / TRACES).parent, copy / BLOB):
        assert os.stat(path).st_ino in synced, path
    synced.clear()
    ts.add_workload("rmsnorm_h4096", Workload(uuid="new", axes={"batch_size": 3}, inputs={
        "hidden_states": RandomInput(), "weight": RandomInput()}), persist=True)
    assert os.stat(dataset / WL_H4096).st_ino in synced


# --- integers beyond int64 --------------------------------------------------------------------


def test_axis_beyond_int64_is_a_load_error(dataset):
    text = (dataset / WL_H4096).read_text().replace('"batch_size":64', f'"batch_size":{1 << 63}')
    (dataset / WL_H4096).write_text(text)
    ts = TraceSet.from_path(dataset)
    assert [(e.path, e.line, e.field) for e in ts.load_errors] == [(WL_H4096, 2, "workload.axes.batch_size")]
    assert "does not fit in int64" in ts.load_errors[0].message
    assert len(ts.get_workloads("rmsnorm_h4096")) == 1


@pytest.mark.parametrize("build, field", [
    (lambda: Workload(uuid="u", axes={"batch_size": 1 << 63}, inputs={}), "axes.batch_size"),
    (lambda: Workload(uuid="u", axes={"batch_size": 10 ** 30}, inputs={}), "axes.batch_size"),
    (lambda: Workload(uuid="u", axes={"batch_size": -1}, inputs={}), "axes.batch_size"),
    (lambda: Workload(uuid="u", axes={}, inputs={}, seed=1 << 64), "seed"),
    (lambda: ScalarInput(value=1 << 63), "value"),
    (lambda: ScalarInput(value=-(1 << 63) - 1), "value"),
    (lambda: AxisConst(value=1 << 63), "value"),
    (lambda: Workload(uuid="u", axes={}, inputs={"eps": {"type": "scalar", "value": 1 << 70}}), "inputs.eps.value"),
])
def test_integers_beyond_int64_are_refused_when_built(build, field):
    with pytest.raises(SchemaError) as info:
        build()
    assert info.value.field == field, str(info.value)


def test_int64_bounds_themselves_are_accepted():
    assert Workload(uuid="u", axes={"b": (1 << 63) - 1}, inputs={}, seed=(1 << 63) - 1).axes["b"] == (1 << 63) - 1
    assert ScalarInput(value=-(1 << 63)).value == -(1 << 63)
    assert ScalarInput(value=True).value is True and ScalarInput(value=1e300).value == 1e300


def test_a_leading_dot_slash_is_the_same_path_inside_the_dataset(tmp_path):
    """FlashInfer-Bench writes blob paths as "./blob/..."; they stay readable, and "./.." does not
    sneak out."""
    from opforge.trace._paths import dataset_path, relative_path_problem

    assert relative_path_problem("./blob/workloads/w.safetensors") is None
    assert dataset_path(tmp_path, "./blob/workloads/w.safetensors") == tmp_path / "blob/workloads/w.safetensors"
    assert "'..'" in relative_path_problem("./../outside/w.safetensors")
