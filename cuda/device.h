// Host-side device helpers for the launchers; plain C++ interface, implemented in device.cu.
#pragma once

namespace opforge::cuda {

// Multiprocessor count of `device`, read once per device and cached.
int sm_count(int device);

// cudaGetErrorString for a cudaError_t value, usable from code that does not include CUDA headers.
const char* error_string(int err);

// cudaErrorNoKernelImageForDevice: the launch found no code for this GPU's arch.
bool is_no_kernel_image(int err);

// The compute capability of `device` as major*10+minor (cached), or -1 when it cannot be read.
int compute_capability(int device);

// Makes `device` current for the calling thread and restores the previous one on destruction;
// torch tensors may live on a device other than the current one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace opforge::cuda
