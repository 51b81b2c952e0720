"""Solutions of ``mul_h8`` (y = x * w, fp32; from the registry tests' helpers) that try every way
of being wrong, and two honest ones. Each entry: name -> (source of kernel.py, options)."""

from __future__ import annotations

from registry_helpers import c_api_source

#: A piece of solution source (needs ``import os, time``): start_daemon(pids) leaves a daemon, double
#: forked into a session of its own, that writes ``daemon-<pid>`` into the folder ``pids`` and
#: sleeps 300 s: what a solution escaping its worker's process group would leave behind.
START_DAEMON = """
def start_daemon(pids):
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            open(os.path.join(pids, f"daemon-{os.getpid()}"), "w").close()
            time.sleep(300)
        os._exit(0)
    os.waitpid(child, 0)
"""

HONEST = """
import torch

def run(x, w):
    return x * w
"""

HONEST_DPS = """
import torch

def run(x, w, y):
    torch.mul(x, w, out=y)
"""

SOURCES = {
    "honest": HONEST,
    "honest_dps": (HONEST_DPS, {"dps": True}),
    "compile_error": (c_api_source("static PyObject* run(PyObject*, PyObject*) { return no_such_symbol; }"),
                      {"language": "cpp", "entry": "kernel.cpp::run"}),
    "import_error": "import opforge_no_such_module\n\ndef run(x, w):\n    return x * w\n",
    "raises": "def run(x, w):\n    raise RuntimeError('the kernel gave up')\n",
    "exits": """
import os, sys

def run(x, w):
    print("about to leave", flush=True)
    os._exit(3)
""",
    "segfault": """
import ctypes

def run(x, w):
    print("reading address 0", flush=True)
    return ctypes.string_at(0)
""",
    "hangs": """
import time

def run(x, w):
    while True:
        time.sleep(0.05)
""",
    "wrong_shape": "def run(x, w):\n    return (x * w)[:, :-1]\n",
    "wrong_dtype": "def run(x, w):\n    return (x * w).double()\n",
    "wrong_values": "def run(x, w):\n    return x * w + 0.01\n",
    "nan_output": """
def run(x, w):
    y = x * w
    y[0, 0] = float("nan")
    return y
""",
    "mutates_input": """
def run(x, w):
    y = x * w
    x.zero_()
    return y
""",
    "returns_input": """
def run(x, w):
    x.mul_(w)
    return x
""",
    "dps_skips_a_row": ("""
import torch

def run(x, w, y):
    torch.mul(x[1:], w, out=y[1:])
""", {"dps": True}),
    "constant": "import torch\n\ndef run(x, w):\n    return torch.zeros_like(x)\n",
    "cached": """
_cache = {}

def run(x, w):
    key = tuple(x.shape)
    if key not in _cache:
        _cache[key] = x * w
    return _cache[key].clone()
""",
    "right_then_wrong": """
calls = {}

def run(x, w):
    n = calls[tuple(x.shape)] = calls.get(tuple(x.shape), 0) + 1
    y = x * w
    return y if n <= 3 else y * 0.5
""",
}

#: The status each solution must get.
EXPECTED = {
    "honest": "PASSED",
    "honest_dps": "PASSED",
    "compile_error": "COMPILE_ERROR",
    "import_error": "COMPILE_ERROR",
    "raises": "RUNTIME_ERROR",
    "exits": "RUNTIME_ERROR",
    "segfault": "RUNTIME_ERROR",
    "hangs": "TIMEOUT",
    "wrong_shape": "INCORRECT_SHAPE",
    "wrong_dtype": "INCORRECT_DTYPE",
    "wrong_values": "INCORRECT_NUMERICAL",
    "nan_output": "INCORRECT_NUMERICAL",
    "mutates_input": "INCORRECT_NUMERICAL",
    "returns_input": "INCORRECT_NUMERICAL",
    "dps_skips_a_row": "INCORRECT_NUMERICAL",
    "constant": "INCORRECT_NUMERICAL",
    "cached": "INCORRECT_NUMERICAL",
    "right_then_wrong": "INCORRECT_NUMERICAL",
}

#: Words the log of each failing solution must contain.
LOG_WORDS = {
    "compile_error": ["no_such_symbol", "was not declared"],
    "import_error": ["opforge_no_such_module"],
    "raises": ["the kernel gave up"],
    "exits": ["exit code 3", "about to leave"],
    "segfault": ["SIGSEGV", "reading address 0", "Fatal Python error: Segmentation fault"],  # faulthandler's
    "hangs": ["no answer within"],
    "wrong_shape": ["shape (", ", 7), expected ("],
    "wrong_dtype": ["float64"],
    "wrong_values": ["outside atol"],
    "nan_output": ["NaN/inf where the reference has none"],
    "mutates_input": ["modified its input x"],
    "returns_input": ["shares memory with input x"],
    "dps_skips_a_row": ["outside atol"],
    "constant": ["outside atol"],
    "cached": ["input set 2 of 3"],
    "right_then_wrong": ["after timing, on a fresh input set"],
}
