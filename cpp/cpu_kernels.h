// Shared helpers for the CPU versions of the ops: dispatch on the element type.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>

#include "dtype.h"
#include "half.h"

namespace opforge::cpu {

// CPU ops release the GIL only for work large enough to repay the ~0.1 us it costs.
constexpr int64_t kReleaseGilElems = int64_t(1) << 16;

// Calls f(T{}) with T the storage type of `dtype`.
template <typename F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f(Half{});
    case DType::kBFloat16: return f(BFloat16{});
    default: return f(float{});
  }
}

// Runs f(T{}) for `dtype`, without the GIL when `elems` is large enough to repay releasing it.
template <typename F>
void run_cpu(DType dtype, int64_t elems, F&& f) {
  std::optional<nanobind::gil_scoped_release> release;
  if (elems >= kReleaseGilElems) release.emplace();
  dispatch_dtype(dtype, f);
}

}  // namespace opforge::cpu
