"""Evaluating solutions: inputs drawn from a recorded seed within each Definition's value domains
(inputs.py), and correctness checks that cannot be fooled (evaluator.py)."""

from .evaluator import Check, DEFAULT_TOLERANCES, check_call, compare_outputs
from .inputs import generate_inputs

__all__ = ["Check", "DEFAULT_TOLERANCES", "check_call", "compare_outputs", "generate_inputs"]
