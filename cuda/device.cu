#include <cuda_runtime.h>

#include "device.h"

namespace opforge::cuda {

int sm_count(int device) {
  static PerDevice memo;
  return memo.get(device, [device] {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
      cudaGetLastError();  // clear the sticky-free error so the launch reports its own status
      n = 132;
    }
    return n;
  });
}

int compute_capability(int device) {
  static PerDevice memo;
  return memo.get(device, [device] {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return major * 10 + minor;
  });
}

const char* error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

bool is_no_kernel_image(int err) { return err == cudaErrorNoKernelImageForDevice; }

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != device) {
    if (cudaSetDevice(device) == cudaSuccess) previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace opforge::cuda
