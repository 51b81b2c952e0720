"""Evaluating solutions: inputs drawn from a recorded seed within each Definition's value domains
(inputs.py), correctness checks that cannot be fooled (evaluator.py), timing (timing.py) and the
runner that puts them together in isolated worker processes (runner.py, pairs.py, worker.py), on
one host or on every GPU of a Ray cluster (cluster/)."""

from .config import BenchmarkConfig, Settings
from .evaluator import (CallRecord, Check, DEFAULT_TOLERANCES, check_call, compare_outputs, judge, run_call)
from .inputs import generate_inputs
from .runner import Benchmark, RunResult, Skipped

__all__ = ["Benchmark", "BenchmarkConfig", "CallRecord", "Check", "DEFAULT_TOLERANCES", "RunResult", "Settings",
           "Skipped", "check_call", "compare_outputs", "generate_inputs", "judge", "run_call"]
