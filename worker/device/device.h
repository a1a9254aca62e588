// Which device the worker trains on: spec.device (TrainingJob) / --device (railyard-worker) is "cpu", "cuda" or
// "auto"; auto means CUDA when at least one GPU is visible. Header-only and free of CUDA headers so the CPU-only build
// and the operator can use it; the caller passes the visible GPU count (worker/kernels/cuda/cuda_check.h's
// device_count() in CUDA builds, 0 otherwise).
#pragma once

#include <string>
#include <string_view>

#include "common/error.h"

namespace railyard::worker {

enum class DeviceKind { kCpu, kCuda };

inline const char* device_name(DeviceKind d) { return d == DeviceKind::kCuda ? "cuda" : "cpu"; }

// Throws ConfigError naming spec.device when the value is unknown, or when "cuda" is asked for and no GPU is visible
// (auto falls back to the CPU instead). built_with_cuda is false when this binary has no CUDA path at all.
inline DeviceKind resolve_device(std::string_view spec, int visible_gpus, bool built_with_cuda) {
  if (spec == "cpu") return DeviceKind::kCpu;
  if (spec == "auto" || spec.empty()) {
    return built_with_cuda && visible_gpus > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  }
  if (spec == "cuda") {
    if (!built_with_cuda) {
      throw ConfigError(
          "spec.device: cuda, but this railyard-worker was built without CUDA (RAILYARD_CUDA=OFF or no "
          "nvcc): use an image built with CUDA, or set spec.device: cpu");
    }
    if (visible_gpus <= 0) {
      throw ConfigError(
          "spec.device: cuda, but no CUDA device is visible to this pod (no GPU or no NVIDIA driver): "
          "request nvidia.com/gpu in spec.resources, or set spec.device: auto or cpu");
    }
    return DeviceKind::kCuda;
  }
  throw ConfigError("spec.device: unknown value \"" + std::string(spec) + "\": use auto, cpu or cuda");
}

}  // namespace railyard::worker
