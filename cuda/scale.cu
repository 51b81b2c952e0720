#include <cuda_runtime.h>

#include "elementwise.cuh"
#include "scale.h"

namespace opforge::cuda {
namespace {

struct Scale {
  static constexpr int kLoads = 1;
  static constexpr bool kCostlyMath = false;  // see launch_rowwise_map
  static constexpr bool kMathBound = false;
  static constexpr bool kJoinsRows = true;  // elementwise: contiguous rows are one long row
  float factor;
  template <typename T, int VEC>
  __device__ __forceinline__ void load(const T* row, int64_t c, Vec<T, VEC> (&raw)[kLoads]) const {
    raw[0] = load_vec<T, VEC>(row + c);
  }
  template <typename T, int VEC>
  __device__ __forceinline__ void compute(const Vec<T, VEC> (&raw)[kLoads], float (&y)[VEC]) const {
    to_floats(raw[0], y);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] *= factor;
  }
};

template <typename T>
int launch_typed(const ScaleParams& p, int device, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const RowwiseShape s{p.rows, p.cols, p.out_stride, p.input_stride};
  const bool wide = p.cols % kVec == 0 && vec_aligned(p.input, p.input_stride, kVec, sizeof(T)) &&
                    vec_aligned(p.out, p.out_stride, kVec, sizeof(T));
  T* out = static_cast<T*>(p.out);
  const T* in = static_cast<const T*>(p.input);
  return wide ? launch_rowwise_map<T, kVec>(out, in, s, Scale{p.factor}, device, stream)
              : launch_rowwise_map<T, 1>(out, in, s, Scale{p.factor}, device, stream);
}

}  // namespace

int launch_scale(const ScaleParams& p, int device, void* stream_ptr) {
  if (p.rows == 0 || p.cols == 0) return 0;
  DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  return dispatch_dtype(p.dtype, [&](auto tag) { return launch_typed<decltype(tag)>(p, device, stream); });
}

}  // namespace opforge::cuda
