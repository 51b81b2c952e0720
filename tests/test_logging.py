"""@opforge_api logging: levels 0 / 1 / 3 / 5, OPFORGE_LOGDEST, and OPFORGE_LOGLEVEL end to end."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

import opforge
from opforge import api_logging, opforge_api


@pytest.fixture(autouse=True)
def fresh_handlers(monkeypatch):
    """Each test starts with no log handler made yet (a handler keeps the stream it was made
    with) and closes the ones it made."""
    handlers: dict = {}
    monkeypatch.setattr(api_logging, "_handlers", handlers)
    monkeypatch.delenv("OPFORGE_LOGDEST", raising=False)
    monkeypatch.delenv("OPFORGE_LOGLEVEL", raising=False)
    yield
    logger = logging.getLogger("opforge.api")
    for h in handlers.values():
        logger.removeHandler(h)
        h.close()


def toy(x, eps=1e-6, *, scale=2.0):
    """Toy op."""
    return x * scale


def failing(x):
    raise ValueError("boom")


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[opforge ")]


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPFORGE_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


# --- levels ----------------------------------------------------------------------------------


def test_level_0_returns_the_function_itself(monkeypatch):
    assert opforge_api(toy, level=0) is toy
    assert opforge_api(level=0)(toy) is toy
    monkeypatch.setenv("OPFORGE_LOGLEVEL", "0")
    assert opforge_api(toy) is toy
    monkeypatch.delenv("OPFORGE_LOGLEVEL")
    assert opforge_api(toy) is toy  # the default is 0


def test_level_0_logs_nothing(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    opforge_api(toy, level=0)(torch.ones(2))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_level_1_names_the_call(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    logged = opforge_api(toy, level=1)
    assert torch.equal(logged(torch.ones(2, 8)), torch.full((2, 8), 2.0))
    out = lines(capsys.readouterr().out)
    assert len(out) == 1
    assert out[0].endswith("] opforge.toy")
    assert "shape" not in out[0]


def test_level_3_adds_shapes_dtypes_and_devices(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    x = torch.ones(2, 8, dtype=torch.bfloat16)[:, :4]
    opforge_api(toy, level=3)(x, 0.5, scale=3.0)
    out = lines(capsys.readouterr().out)
    assert len(out) == 2
    call, result = out
    assert "opforge.toy(" in call
    assert "shape=(2, 4)" in call and "dtype=bfloat16" in call and "device=cpu" in call
    assert "stride=(8, 1)" in call
    assert "0.5" in call and "scale=3.0" in call
    assert "opforge.toy -> Tensor(shape=(2, 4)" in result and "host" in result and "ms" in result
    assert "min=" not in call


def test_level_5_adds_value_statistics(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    x = torch.tensor([[1.0, 2.0, float("nan"), -3.0]])
    opforge_api(toy, level=5)(x, scale=1.0)
    call = lines(capsys.readouterr().out)[0]
    assert "min=-3" in call and "max=2" in call and "mean=0" in call and "nan=1" in call


@pytest.mark.parametrize("value", [torch.empty(0, 4), torch.arange(6), torch.tensor(float("nan")), [torch.ones(2)],
                                   torch.randint(0, 256, (4, 8), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)],
                         ids=["empty", "int64", "all-nan", "list", "fp4x2-packed"])
def test_level_5_describes_any_argument(capsys, monkeypatch, value):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    opforge_api(lambda v: v, level=5)(value)
    assert "Tensor(shape=" in lines(capsys.readouterr().out)[0]


def test_exceptions_are_logged_and_reraised(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stderr")
    logged = opforge_api(failing, level=1)
    with pytest.raises(ValueError, match="^boom$"):
        logged(torch.ones(1))
    err = lines(capsys.readouterr().err)
    assert err[-1].endswith("opforge.failing raised ValueError: boom")


def test_real_op_error_is_logged(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stderr")
    logged = opforge_api(opforge.rmsnorm, level=3)
    with pytest.raises(ValueError, match="weight has shape"):
        logged(torch.randn(2, 8), torch.randn(7))
    err = lines(capsys.readouterr().err)
    assert "opforge.rmsnorm(Tensor(shape=(2, 8)" in err[0]
    assert "opforge.rmsnorm raised ValueError: opforge.rmsnorm: weight has shape (7,)" in err[-1]


def test_decorated_function_keeps_name_doc_and_attributes():
    logged = opforge_api(opforge.rmsnorm, level=1)
    assert logged.__name__ == "rmsnorm" and logged.__doc__ == opforge.rmsnorm.__doc__
    assert logged.has_backend("cuda") and logged.backends == opforge.rmsnorm.backends
    assert opforge_api(toy, level=3).__doc__ == "Toy op."


def test_level_comes_from_the_environment_when_decorating(capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    monkeypatch.setenv("OPFORGE_LOGLEVEL", "1")
    logged = opforge_api(toy)
    monkeypatch.setenv("OPFORGE_LOGLEVEL", "0")  # later changes do not affect a decorated op
    logged(torch.ones(1))
    assert len(lines(capsys.readouterr().out)) == 1


@pytest.mark.parametrize("raw", ["abc", "6", "-1", "1.5"])
def test_invalid_level_in_the_environment(monkeypatch, raw):
    monkeypatch.setenv("OPFORGE_LOGLEVEL", raw)
    with pytest.raises(ValueError, match="OPFORGE_LOGLEVEL"):
        opforge_api(toy)


# --- destinations ----------------------------------------------------------------------------


@pytest.mark.parametrize("dest", ["stdout", "stderr"])
def test_stream_destinations(capsys, monkeypatch, dest):
    monkeypatch.setenv("OPFORGE_LOGDEST", dest)
    opforge_api(toy, level=1)(torch.ones(1))
    captured = capsys.readouterr()
    chosen, other = (captured.out, captured.err) if dest == "stdout" else (captured.err, captured.out)
    assert len(lines(chosen)) == 1 and lines(other) == []


def test_default_destination_is_stderr(capsys):
    opforge_api(toy, level=1)(torch.ones(1))
    captured = capsys.readouterr()
    assert len(lines(captured.err)) == 1 and captured.out == ""


def test_file_destination_with_pid(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_LOGDEST", str(tmp_path / "opforge-%i.log"))
    opforge_api(toy, level=3)(torch.ones(3, 5))
    path = tmp_path / f"opforge-{os.getpid()}.log"
    assert path.exists()
    text = path.read_text()
    assert "opforge.toy(Tensor(shape=(3, 5)" in text


def test_destination_is_read_at_each_call(capsys, tmp_path, monkeypatch):
    logged = opforge_api(toy, level=1)
    monkeypatch.setenv("OPFORGE_LOGDEST", "stdout")
    logged(torch.ones(1))
    monkeypatch.setenv("OPFORGE_LOGDEST", "stderr")
    logged(torch.ones(1))
    logged(torch.ones(1))
    log_file = tmp_path / "calls.log"
    monkeypatch.setenv("OPFORGE_LOGDEST", str(log_file))
    logged(torch.ones(1))
    captured = capsys.readouterr()
    assert len(lines(captured.out)) == 1
    assert len(lines(captured.err)) == 2
    assert len(lines(log_file.read_text())) == 1


# --- end to end, in a fresh interpreter ------------------------------------------------------


def test_loglevel_end_to_end():
    code = (
        "import torch, opforge\n"
        "opforge.rmsnorm(torch.randn(2, 8), torch.randn(8))\n"
        "opforge.silu_and_mul(torch.randn(3, 4))\n"
    )
    result = run_python(code, OPFORGE_LOGLEVEL="3")
    assert result.returncode == 0, result.stderr
    err = lines(result.stderr)
    rms = [line for line in err if "opforge.rmsnorm(" in line]
    assert rms and "shape=(2, 8)" in rms[0] and "shape=(8,)" in rms[0]
    assert any("opforge.silu_and_mul(" in line and "shape=(3, 4)" in line for line in err)
    assert result.stdout == ""


def test_loglevel_0_end_to_end_prints_nothing():
    code = "import torch, opforge\nopforge.rmsnorm(torch.randn(2, 8), torch.randn(8))\n"
    result = run_python(code, OPFORGE_LOGLEVEL="0")
    assert result.returncode == 0, result.stderr
    assert lines(result.stderr) == [] and result.stdout == ""


@pytest.mark.parametrize("raw", ["verbose", "9"])
def test_invalid_loglevel_fails_the_import(raw):
    result = run_python("import opforge", OPFORGE_LOGLEVEL=raw)
    assert result.returncode != 0
    assert "ValueError" in result.stderr and "OPFORGE_LOGLEVEL" in result.stderr


# --- logging never changes what a call does ---------------------------------------------------


def _freed(t):
    t = t.clone()
    t.untyped_storage().resize_(0)
    return t


@pytest.mark.parametrize("level", [1, 3, 5])
@pytest.mark.parametrize("bad, message", [
    (lambda w: w.to("meta"), "opforge.rmsnorm: weight is on meta"),
    (lambda w: w.to_sparse(), "opforge.rmsnorm: weight cannot be passed to the kernels"),
    (_freed, "opforge.rmsnorm: weight (shape (8,)) reaches byte 32 of its storage, which holds 0 bytes"),
    (lambda w: torch.complex(torch.zeros_like(w), -w).conj().imag, "opforge.rmsnorm: weight is a negative-bit view"),
], ids=["meta", "sparse", "freed-storage", "negative-bit"])
def test_logged_calls_keep_the_ops_errors(capsys, monkeypatch, level, bad, message):
    """Describing the arguments (value statistics at level 5) must not fail, crash or read
    memory before the op has checked its arguments: the op's own error comes out."""
    monkeypatch.setenv("OPFORGE_LOGDEST", "stderr")
    logged = opforge_api(opforge.rmsnorm, level=level)
    with pytest.raises(ValueError) as info:
        logged(torch.randn(2, 8), bad(torch.randn(8)), skip_check=True)
    assert str(info.value).startswith(message), str(info.value)
    assert lines(capsys.readouterr().err)[-1].endswith(f"raised ValueError: {info.value}")


@pytest.mark.compile
@pytest.mark.parametrize("level", [1, 3, 5])
def test_logged_ops_compile_with_fullgraph(capsys, monkeypatch, level):
    monkeypatch.setenv("OPFORGE_LOGDEST", "stderr")
    torch._dynamo.reset()
    logged = opforge_api(opforge.rmsnorm, level=level)
    compiled = torch.compile(lambda x, w: logged(x, w) * 2, fullgraph=True, dynamic=False)
    x, w = torch.randn(4, 64), torch.randn(64)
    assert torch.equal(compiled(x, w), opforge.rmsnorm(x, w) * 2)
    torch._dynamo.reset()


@pytest.mark.compile
def test_loglevel_with_fullgraph_compile_end_to_end():
    code = (
        "import torch, opforge\n"
        # aot_eager: dynamo's full-graph trace through the logged op without Inductor's CPU code
        # generation (seconds in a fresh process); Inductor with logging runs in-process above.
        "f = torch.compile(lambda x, w: opforge.rmsnorm(x, w) * 2, fullgraph=True, dynamic=False, backend='aot_eager')\n"
        "x, w = torch.randn(4, 64), torch.randn(64)\n"
        "assert torch.equal(f(x, w), opforge.rmsnorm(x, w) * 2)\n"
        "try:\n"
        "    opforge.rmsnorm(x, w.to('meta'))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    result = run_python(code, OPFORGE_LOGLEVEL="5")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("opforge.rmsnorm: weight is on meta"), result.stdout
    assert any("opforge.rmsnorm(" in line and "device=meta" in line for line in lines(result.stderr))
