// Kernel launches that may use programmatic dependent launch (PDL, compute capability 9.0+):
// with it, a kernel's blocks may be scheduled while the previous kernel on the stream is still
// finishing, and wait on the device (griddepcontrol.wait) until that kernel's writes are visible.
// What this saves is the launch gap between back-to-back small kernels (decode-size norms and
// activations), not bandwidth.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "device.h"

namespace opforge::cuda {

// First thing in every kernel that can be launched with PDL: wait until the previous kernel on
// the stream has completed and its memory is visible (a no-op for a launch without PDL), then
// let the next kernel's blocks be scheduled as soon as resources free up. Everything the kernel
// reads (inputs, weights) is read after the wait, so any of it may come from the previous kernel.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Lets the next kernel on the stream, if launched with PDL, be scheduled before this one ends (its
// blocks still wait for this kernel's writes in wait_for_previous_grid). Only for a grid whose
// blocks are all resident at once: the next kernel's blocks would otherwise take the SMs that
// this grid's later blocks need.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `stream`, with programmatic stream serialisation when `pdl` is set (the
// caller has checked the GPU supports it). Returns the launch's cudaError_t.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl ? attribute : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Whether the code of `kKernel` loaded for `device` (the current device) was generated for a
// virtual arch of 9.0 or newer, so that its wait_for_previous_grid() exists. A build with PTX for
// an older arch only (CUDA_ARCH_LIST="8.0+PTX") runs on a Hopper GPU by JIT-compiling that PTX:
// the image is then sm_90 (binaryVersion 90) but was written without the wait (ptxVersion 80),
// and a PDL launch of it would read the previous kernel's output before it is written. Where the
// driver reports no PTX version (0), the image's own arch decides. Read once per device. Every
// kernel of one .cu file is compiled for the same archs, so any of them tells.
template <auto kKernel>
bool image_waits_for_previous_grid(int device) {
  static PerDevice memo;  // 1 yes, -1 no
  return memo.get(device, [] {
    cudaFuncAttributes attr{};
    const bool yes = cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess && attr.binaryVersion >= 90 &&
                     (attr.ptxVersion >= 90 || attr.ptxVersion == 0);
    if (!yes) cudaGetLastError();  // not the launch's error
    return yes ? 1 : -1;
  }) > 0;
}

}  // namespace opforge::cuda
