"""scale: out = x * factor, the simplest memory-bound op (its floor is a copy).

Each case is expanded by conftest.pytest_generate_tests (ops x impls x shapes x dtypes).
"""
FAMILY = "scale"


def bench_scale(op_bench, case):
    op_bench(case)
