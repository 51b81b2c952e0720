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
