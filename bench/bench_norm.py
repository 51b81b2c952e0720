"""RMSNorm family: rmsnorm, fused_add_rmsnorm, gemma_rmsnorm, gemma_fused_add_rmsnorm.

Each case is expanded by conftest.pytest_generate_tests (ops x impls x shapes x dtypes).
"""
FAMILY = "norm"


def bench_norm(op_bench, case):
    op_bench(case)
