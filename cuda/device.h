// Host-side device helpers for the launchers; plain C++ interface, implemented in device.cu.
#pragma once
#include <atomic>

namespace opforge::cuda {

// One int per device, computed the first time it is asked for and kept (for devices 0..63;
// others compute every time): device attributes and per-kernel facts the launchers need once
// per device. 0 means "not known yet", so `compute` must return a nonzero value (failures
// included: they are kept too, as a device that cannot answer once will not later).
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;

  template <typename Compute>
  int get(int device, Compute&& compute) {
    if (device < 0 || device >= kMaxDevices) return compute();
    int value = values_[device].load(std::memory_order_relaxed);
    if (value == 0) {
      value = compute();
      values_[device].store(value, std::memory_order_relaxed);
    }
    return value;
  }

 private:
  std::atomic<int> values_[kMaxDevices] = {};
};

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
