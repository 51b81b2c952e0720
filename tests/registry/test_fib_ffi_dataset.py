"""A FlashInfer-Bench-style dataset end to end under ``opforge run``: the layout of its
examples/ffi folder (a ``gemm_n4096_k4096`` Definition, workloads, and a CUDA solution written
for TVM-FFI that names no ``binding`` and no ``destination_passing_style``, as FlashInfer-Bench
writes them: both default to TVM-FFI and destination passing there, and must mean the same here).

The solution below is written for this test in that style: two source files (a header and the
kernel), the stream taken from TVM-FFI's environment (the caller's current stream), a dynamic
shared-memory opt-in, and target_hardware naming another GPU, which the test widens to the GPU
at hand as a user would. On a GPU with apache-tvm-ffi and nvcc the run must build the solution
once and pass every workload; elsewhere the dataset must at least load and be refused clearly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opforge.trace import TraceSet

DEFINITION = {
    "name": "gemm_n4096_k4096",
    "op_type": "gemm",
    "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 4096}, "K": {"type": "const", "value": 4096}},
    "inputs": {"A": {"shape": ["M", "K"], "dtype": "float16"}, "B": {"shape": ["N", "K"], "dtype": "float16"}},
    "outputs": {"C": {"shape": ["M", "N"], "dtype": "float16"}},
    "reference": "import torch\n\ndef run(A, B):\n    return torch.matmul(A, B.T)\n",
    "tags": [],
    "description": "C = A @ B.T with N = K = 4096, fp16 in and out.",
}

HEADER = r"""
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// The Definition's constant axes.
constexpr int kN = 4096;
constexpr int kK = 4096;
// Block tile (rows of A x rows of B) and depth of one shared-memory stage.
constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 32;
"""

KERNEL = r"""
#include "gemm.h"

#include <mma.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

// 4 warps per block, each a 32 x 32 quarter of the 64 x 64 tile as 2 x 2 WMMA fragments; fp32
// accumulation staged through (dynamic) shared memory for the fp16 store.
__global__ void __launch_bounds__(128) gemm_kernel(const __half* A, const __half* B, __half* C, int M) {
  extern __shared__ __align__(16) unsigned char smem[];
  __half* a_tile = reinterpret_cast<__half*>(smem);                // [kTileM][kTileK + 8]
  __half* b_tile = a_tile + kTileM * (kTileK + 8);                 // [kTileN][kTileK + 8]
  float* c_tile = reinterpret_cast<float*>(b_tile + kTileN * (kTileK + 8));  // [kTileM][kTileN + 4]
  const int m0 = blockIdx.y * kTileM, n0 = blockIdx.x * kTileN;
  const int warp = threadIdx.x / 32, wm = (warp / 2) * 32, wn = (warp % 2) * 32;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.f);
  for (int k0 = 0; k0 < kK; k0 += kTileK) {
    for (int v = threadIdx.x; v < kTileM * kTileK / 8; v += blockDim.x) {  // 8 halves per 16 bytes
      const int r = v / (kTileK / 8), c = (v % (kTileK / 8)) * 8;
      uint4 a = make_uint4(0, 0, 0, 0);
      if (m0 + r < M) a = *reinterpret_cast<const uint4*>(A + size_t(m0 + r) * kK + k0 + c);
      *reinterpret_cast<uint4*>(a_tile + r * (kTileK + 8) + c) = a;
      *reinterpret_cast<uint4*>(b_tile + r * (kTileK + 8) + c) =
          *reinterpret_cast<const uint4*>(B + size_t(n0 + r) * kK + k0 + c);
    }
    __syncthreads();
    for (int kk = 0; kk < kTileK; kk += 16) {
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> fa[2];
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major> fb[2];
      for (int i = 0; i < 2; ++i) nvcuda::wmma::load_matrix_sync(fa[i], a_tile + (wm + 16 * i) * (kTileK + 8) + kk, kTileK + 8);
      for (int j = 0; j < 2; ++j) nvcuda::wmma::load_matrix_sync(fb[j], b_tile + (wn + 16 * j) * (kTileK + 8) + kk, kTileK + 8);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) nvcuda::wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      nvcuda::wmma::store_matrix_sync(c_tile + (wm + 16 * i) * (kTileN + 4) + wn + 16 * j, acc[i][j], kTileN + 4,
                                      nvcuda::wmma::mem_row_major);
  __syncthreads();
  for (int e = threadIdx.x; e < kTileM * kTileN; e += blockDim.x) {
    const int r = e / kTileN, c = e % kTileN;
    if (m0 + r < M) C[size_t(m0 + r) * kN + n0 + c] = __float2half_rn(c_tile[r * (kTileN + 4) + c]);
  }
}

void gemm(tvm::ffi::TensorView A, tvm::ffi::TensorView B, tvm::ffi::TensorView C) {
  TVM_FFI_ICHECK_EQ(A.ndim(), 2) << "A must be [M, 4096]";
  TVM_FFI_ICHECK(B.size(0) == kN && B.size(1) == kK) << "B must be [4096, 4096]";
  const int M = static_cast<int>(A.size(0));
  if (M == 0) return;
  const DLDevice dev = A.device();
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(dev.device_type, dev.device_id));
  const size_t shared = (kTileM + kTileN) * (kTileK + 8) * sizeof(__half) + kTileM * (kTileN + 4) * sizeof(float);
  cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  const dim3 grid(kN / kTileN, (M + kTileM - 1) / kTileM);
  gemm_kernel<<<grid, 128, shared, stream>>>(static_cast<const __half*>(A.data_ptr()),
                                              static_cast<const __half*>(B.data_ptr()),
                                              static_cast<__half*>(C.data_ptr()), M);
  TVM_FFI_ICHECK_EQ(cudaGetLastError(), cudaSuccess) << "gemm_kernel launch failed";
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(gemm, gemm);
"""


def _gpu_name() -> str:
    return torch.cuda.get_device_name(0).removeprefix("NVIDIA ").split()[0] if torch.cuda.is_available() else "H100"


def write_dataset(root: Path, targets: list[str]) -> Path:
    """The FlashInfer-Trace folder layout of FlashInfer-Bench's examples, with this test's kernel."""
    (root / "definitions" / "gemm").mkdir(parents=True)
    (root / "definitions" / "gemm" / "gemm_n4096_k4096.json").write_text(json.dumps(DEFINITION, indent=2))
    (root / "workloads" / "gemm").mkdir(parents=True)
    lines = [{"definition": "gemm_n4096_k4096", "solution": None, "evaluation": None,
              "workload": {"uuid": f"gemm-m{m}", "axes": {"M": m},
                           "inputs": {"A": {"type": "random"}, "B": {"type": "random"}}}} for m in (1, 48, 256)]
    (root / "workloads" / "gemm" / "gemm_n4096_k4096.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    solution = {
        "name": "example_style_gemm",
        "definition": "gemm_n4096_k4096",
        "description": "A WMMA GEMM written the way FlashInfer-Bench's TVM-FFI examples are.",
        "author": "test",
        # No "binding" and no "destination_passing_style": FlashInfer-Bench's defaults apply.
        "spec": {"language": "cuda", "target_hardware": targets, "entry_point": "kernel.cu::gemm",
                 "dependencies": []},
        "sources": [{"path": "gemm.h", "content": HEADER}, {"path": "kernel.cu", "content": KERNEL}],
    }
    folder = root / "solutions" / "test" / "gemm" / "gemm_n4096_k4096"
    folder.mkdir(parents=True)
    (folder / "example_style_gemm.json").write_text(json.dumps(solution, indent=2))
    return root


def test_the_dataset_loads_with_flashinfer_bench_defaults(tmp_path):
    """Read as FlashInfer-Bench reads it: the missing binding means TVM-FFI, the missing
    destination_passing_style means the outputs are passed in."""
    ts = TraceSet.from_path(write_dataset(tmp_path, ["B200"]))
    sol = ts.solutions["gemm_n4096_k4096"][0]
    assert sol.spec.binding is None and sol.spec.destination_passing_style is True
    assert [w.workload.axes["M"] for w in ts.workloads["gemm_n4096_k4096"]] == [1, 48, 256]


def _run(dataset: Path, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-m", "opforge", "run", "--dataset", str(dataset), "--iterations", "5",
                           "--warmup", "1"], capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.gpu
def test_the_dataset_runs_end_to_end_on_this_gpu(tmp_path):
    """target_hardware widened to the GPU at hand; the solution builds once through TVM-FFI and
    passes every workload against the Definition's reference."""
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    dataset = write_dataset(tmp_path / "ds", ["B200", _gpu_name()])
    done = _run(dataset, {})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = [t for t in TraceSet.from_path(dataset).traces.get("gemm_n4096_k4096", [])
              if t.solution == "example_style_gemm"]
    assert sorted(t.workload.axes["M"] for t in traces) == [1, 48, 256], done.stdout[-3000:]
    for t in traces:
        assert t.evaluation.status == "PASSED", (t.workload.axes, t.evaluation.log)
        assert t.evaluation.performance.latency_ms > 0


@pytest.mark.gpu
def test_a_solution_for_another_gpu_is_skipped_with_the_reason(tmp_path):
    dataset = write_dataset(tmp_path / "ds", ["B200"])
    done = _run(dataset, {})
    out = done.stdout + done.stderr
    assert "B200" in out, out[-3000:]
