#include "worker/device/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "common/error.h"
#include "common/pod_env.h"

namespace railyard::worker {

namespace {

bool hides_all_gpus(const char* env) {
  if (env == nullptr) return false;
  const std::string v(env);
  return v.empty() || v == "-1" || v == "none" || v == "void" || v == "NoDevFiles";
}

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

}  // namespace

int gpu_device_nodes(const std::string& dev_dir) {
  if (hides_all_gpus(std::getenv("CUDA_VISIBLE_DEVICES")) || hides_all_gpus(std::getenv("NVIDIA_VISIBLE_DEVICES"))) {
    return 0;
  }
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dev_dir, ec)) {
    const std::string name = e.path().filename().string();
    // nvidia0, nvidia1, ...: one per GPU (nvidiactl, nvidia-uvm, nvidia-modeset are not GPUs)
    if (name.size() <= 6 || name.compare(0, 6, "nvidia") != 0) continue;
    bool digits = true;
    for (size_t i = 6; i < name.size(); ++i) digits = digits && std::isdigit(static_cast<unsigned char>(name[i]));
    if (digits) ++n;
  }
  return n;
}

std::string cuda_module_path() {
  if (const char* p = std::getenv(pod_env::kCudaModule); p != nullptr && *p != '\0') return p;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return kCudaModuleFile;  // the dynamic loader's search path
  return (exe.parent_path().parent_path() / "lib" / kCudaModuleFile).string();
}

bool library_mapped(std::string_view name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

CudaModule& CudaModule::load(const std::string& path) {
  static std::mutex mu;
  static CudaModule* loaded = nullptr;
  std::lock_guard lock(mu);
  if (loaded != nullptr) return *loaded;
  const std::string fix = ": install the CUDA module next to railyard-worker (../lib/" + std::string(kCudaModuleFile) +
                          ") or set RAILYARD_CUDA_MODULE to its path; or train on the CPU (--device cpu)";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) throw ConfigError("cannot load the CUDA module " + path + ": " + dl_error() + fix);
  auto sym = [&](const char* name) {
    dlerror();
    void* s = dlsym(h, name);
    if (s == nullptr) {
      const std::string why = dl_error();
      dlclose(h);
      throw ConfigError("the CUDA module " + path + " has no entry point " + name + " (" + why +
                        "): it is not a railyard CUDA module" + fix);
    }
    return s;
  };
  const auto abi = reinterpret_cast<CudaModuleAbiFn>(sym(kCudaModuleAbiSymbol));
  if (const int got = abi(); got != kCudaModuleAbi) {
    dlclose(h);
    throw ConfigError("the CUDA module " + path + " implements device interface version " + std::to_string(got) +
                      ", this railyard-worker needs " + std::to_string(kCudaModuleAbi) +
                      ": use the module built with this railyard-worker" + fix);
  }
  auto* m = new CudaModule();  // lives as long as the process, like the mapping
  m->path_ = path;
  m->handle_ = h;
  m->device_count_ = reinterpret_cast<CudaModuleDeviceCountFn>(sym(kCudaModuleDeviceCountSymbol));
  m->create_ = reinterpret_cast<CudaModuleCreateFn>(sym(kCudaModuleCreateSymbol));
  loaded = m;
  return *m;
}

void* CudaModule::symbol(const char* name) const { return dlsym(handle_, name); }

std::unique_ptr<Kernels<float>> CudaModule::create_kernels() const {
  char err[1024] = {0};
  Kernels<float>* k = create_(err, sizeof err);
  if (k == nullptr) throw Error(std::string(err[0] != '\0' ? err : "CUDA module: creating the device failed"));
  return std::unique_ptr<Kernels<float>>(k);
}

}  // namespace railyard::worker
