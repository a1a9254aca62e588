// The CUDA device as a module loaded on demand (issue #11): railyard-worker does not link cudart/cuBLASLt, which the
// loader would map and relocate at every start (0.67 s, 223 MB RSS measured 2026-11-24) even for CPU runs. The CUDA
// implementation of the device interface lives in librailyard_cuda.so (worker/kernels/cuda/module.cc), dlopen'ed only
// when the resolved device is CUDA: `--device cuda`, or `auto` with GPU device nodes present (gpu_device_nodes(),
// decided without loading any CUDA library). No CUDA headers here; this file is part of every build.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "worker/device/kernels.h"

namespace railyard::worker {

// Bumped whenever Kernels<T> (kernels.h) or the entry points below change: a module from another build is refused.
constexpr int kCudaModuleAbi = 8;

// The entry points the module exports (extern "C", no name mangling). create_kernels returns null and writes a
// message into err (at most err_len bytes, NUL-terminated) when it fails (no usable GPU).
using CudaModuleAbiFn = int (*)();
using CudaModuleDeviceCountFn = int (*)();
using CudaModuleCreateFn = Kernels<float>* (*)(char* err, size_t err_len);
inline constexpr const char* kCudaModuleAbiSymbol = "railyard_cuda_module_abi";
inline constexpr const char* kCudaModuleDeviceCountSymbol = "railyard_cuda_device_count";
inline constexpr const char* kCudaModuleCreateSymbol = "railyard_cuda_create_kernels";
inline constexpr const char* kCudaModuleFile = "librailyard_cuda.so";

// GPUs this process could see, counted without loading a CUDA library: the NVIDIA driver's /dev/nvidia<N> device
// nodes under dev_dir (what the device plugin mounts into a GPU pod), unless CUDA_VISIBLE_DEVICES or
// NVIDIA_VISIBLE_DEVICES hides them all ("", "-1", "none", "void"). Only decides whether `auto` loads the module; the
// count that resolve_device sees comes from the CUDA runtime inside it.
int gpu_device_nodes(const std::string& dev_dir = "/dev");

// Where the module is: $RAILYARD_CUDA_MODULE if set, else <directory of this executable>/../lib/librailyard_cuda.so
// (the build tree's bin/ and lib/; an image installs both the same way).
std::string cuda_module_path();

// True when a file whose name contains `name` is mapped into this process (/proc/self/maps): how the worker reports
// whether the CUDA runtime was loaded, and how tests check that a CPU run did not load it.
bool library_mapped(std::string_view name);

// The loaded module (dlopen RTLD_NOW|RTLD_LOCAL, once per process, never unloaded: its code backs the Kernels
// object's vtable). Throws ConfigError naming the path, dlerror() and the fix when it cannot be loaded, lacks an entry
// point or was built for another interface version.
class CudaModule {
 public:
  static CudaModule& load(const std::string& path = cuda_module_path());
  const std::string& path() const { return path_; }
  // Usable CUDA devices per the CUDA runtime (0 without a driver).
  int device_count() const { return device_count_(); }
  // The CUDA device interface on the current device; throws Error with the module's message (no usable GPU).
  std::unique_ptr<Kernels<float>> create_kernels() const;
  // Another entry point of the module (e.g. the NCCL backend's, worker/comm/nccl_module.h); null when it has none
  // (a module built without NCCL).
  void* symbol(const char* name) const;

 private:
  CudaModule() = default;
  std::string path_;
  void* handle_ = nullptr;
  CudaModuleDeviceCountFn device_count_ = nullptr;
  CudaModuleCreateFn create_ = nullptr;
};

}  // namespace railyard::worker
