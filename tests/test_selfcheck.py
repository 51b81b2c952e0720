"""``python -m opforge``: the build's description and a check of every op on every device here."""

import json
import subprocess
import sys

import opforge
from opforge.ops import __all__ as OPS


def test_self_check_covers_every_op_and_passes():
    done = subprocess.run([sys.executable, "-m", "opforge"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    info, _ = json.JSONDecoder().raw_decode(done.stdout)
    assert info["version"] == opforge.__version__
    checked = {line.split()[1] for line in done.stdout.splitlines() if line.startswith(("ok ", "FAIL"))}
    assert checked == set(OPS)
    assert done.stdout.rstrip().endswith("all ops agree with the reference")


def test_python_dash_m_runs_the_opforge_command():
    """`python -m opforge <command>` is `opforge <command>`: its arguments are not ignored."""
    info = subprocess.run([sys.executable, "-m", "opforge", "info"], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["version"] == opforge.__version__
    usage = subprocess.run([sys.executable, "-m", "opforge", "run", "--help"], capture_output=True, text=True,
                           timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: opforge run"), usage.stdout + usage.stderr
    bad = subprocess.run([sys.executable, "-m", "opforge", "no-such-command"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'no-such-command'" in bad.stderr
    selfcheck = subprocess.run([sys.executable, "-m", "opforge", "selfcheck", "--help"], capture_output=True,
                               text=True, timeout=120)
    assert selfcheck.returncode == 0 and "usage: opforge selfcheck" in selfcheck.stdout
