// Element types shared by the C++ bindings and the CUDA launchers (no CUDA headers here).
#pragma once
#include <cstdint>

namespace opforge {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// Widest vector (in elements) usable for 16-byte accesses of this type.
inline int max_vec_elems(DType t) { return 16 / dtype_size(t); }

// True when `ptr` and every row stride allow `vec`-element accesses.
inline bool vec_aligned(const void* ptr, int64_t stride_elems, int vec, int elem_size) {
  return reinterpret_cast<uintptr_t>(ptr) % (uintptr_t(vec) * elem_size) == 0 && stride_elems % vec == 0;
}

}  // namespace opforge
