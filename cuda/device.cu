#include <cuda_runtime.h>

#include <atomic>

#include "device.h"

namespace opforge::cuda {

namespace {
constexpr int kMaxDevices = 64;
std::atomic<int> g_sm_count[kMaxDevices];  // 0 = not read yet
std::atomic<int> g_cc[kMaxDevices];        // 0 = not read yet
}  // namespace

int sm_count(int device) {
  if (device < 0 || device >= kMaxDevices) return 132;
  int n = g_sm_count[device].load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
    cudaGetLastError();  // clear the sticky-free error so the launch reports its own status
    n = 132;
  }
  g_sm_count[device].store(n, std::memory_order_relaxed);
  return n;
}

int compute_capability(int device) {
  if (device >= 0 && device < kMaxDevices) {
    const int cached = g_cc[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  const int cc = major * 10 + minor;
  if (device >= 0 && device < kMaxDevices) g_cc[device].store(cc, std::memory_order_relaxed);
  return cc;
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
