"""Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul ([..., 2d] -> [..., d]).

Each case is expanded by conftest.pytest_generate_tests (ops x impls x shapes x dtypes).
"""
FAMILY = "act"


def bench_activation(op_bench, case):
    op_bench(case)
