#include "worker/optim/offload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "worker/kernels/cpu/adamw.h"

namespace railyard::worker {

OffloadMode parse_offload(const std::string& value) {
  if (value == "none") return OffloadMode::kNone;
  if (value == "optimizer") return OffloadMode::kOptimizer;
  if (value == "optimizer,params" || value == "params,optimizer" || value == "params") {
    throw ConfigError("--offload " + value +
                      ": parameter offload (weights streamed from host memory) is not implemented; use --offload "
                      "optimizer (AdamW state on the host) or none");
  }
  throw ConfigError("--offload '" + value + "' is not one of none, optimizer");
}

const char* to_string(OffloadMode m) { return m == OffloadMode::kOptimizer ? "optimizer" : "none"; }

std::vector<OffloadGroup> offload_groups(const GptConfig& c) {
  const auto sizes = param_sizes(c);
  std::array<size_t, kNumParamTensors> offsets{};
  for (int i = 1; i < kNumParamTensors; ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  const size_t L = c.num_layers;
  std::vector<OffloadGroup> groups(L + 2);
  groups[0] = {{offsets[0], sizes[0], decays(0)}, {offsets[1], sizes[1], decays(1)}};
  // Tensors 2..13 are stacked with the layer outermost (gpt_config.h): layer l's slice is the l-th of L equal ones.
  for (size_t l = 0; l < L; ++l) {
    for (int i = 2; i < 14; ++i) {
      const size_t per = sizes[i] / L;
      groups[1 + l].push_back({offsets[i] + l * per, per, decays(i)});
    }
    // The MoE router (L, E, C) follows the 16 tensors; AdamW decays it (a matrix).
    if (const size_t r = router_size(c); r > 0) groups[1 + l].push_back({router_offset(c) + l * (r / L), r / L, true});
  }
  groups[L + 1] = {{offsets[14], sizes[14], decays(14)}, {offsets[15], sizes[15], decays(15)}};
  return groups;
}

namespace {
size_t largest_group(const std::vector<OffloadGroup>& groups) {
  size_t most = 0;
  for (const auto& g : groups) {
    size_t n = 0;
    for (const auto& r : g) n += r.count;
    most = std::max(most, n);
  }
  return most;
}
}  // namespace

size_t offload_host_bytes(const GptConfig& c) {
  return (2 * num_parameters(c) + 2 * largest_group(offload_groups(c))) * sizeof(float);
}

OffloadAdamW::OffloadAdamW(const GptConfig& config, const AdamWHyper& hyper, int threads, Kernels<float>* device)
    : config_(config),
      hyper_(hyper),
      device_(device != nullptr && !device->host_accessible() ? device : nullptr),
      groups_(offload_groups(config)),
      pool_(std::max(1, threads)),
      m_(num_parameters(config)),
      v_(num_parameters(config)),
      stage_g_(largest_group(groups_)),
      stage_p_(largest_group(groups_)) {
  thread_ = std::thread([this] { loop(); });
}

OffloadAdamW::~OffloadAdamW() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !pending_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

size_t OffloadAdamW::host_bytes() const {
  return (m_.size() + v_.size() + stage_g_.size() + stage_p_.size()) * sizeof(float);
}

void OffloadAdamW::start(float* params, const float* grads, float lr, float grad_scale) {
  wait_all();
  ++t_;
  {
    std::lock_guard lock(mu_);
    params_ = params;
    grads_ = grads;
    lr_ = lr;
    scale_ = grad_scale;
    step_ = cpu::adamw_step(lr, hyper_.beta1, hyper_.beta2, hyper_.eps, t_);  // the same scalars as AdamW::update
    done_ = 0;
    pending_ = true;
  }
  cv_.notify_all();
}

void OffloadAdamW::wait_group(int g) {
  std::unique_lock lock(mu_);
  if (pending_ && done_ <= static_cast<size_t>(g)) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return !pending_ || done_ > static_cast<size_t>(g); });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (error_) std::rethrow_exception(error_);
}

void OffloadAdamW::wait_all() { wait_group(static_cast<int>(groups_.size()) - 1); }

double OffloadAdamW::take_wait_seconds() {
  std::lock_guard lock(mu_);
  return std::exchange(wait_seconds_, 0.0);
}

double OffloadAdamW::last_update_seconds() {
  std::lock_guard lock(mu_);
  return update_seconds_;
}

void OffloadAdamW::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (pending_ && done_ < groups_.size()); });
    if (stop_) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t g = 0; g < groups_.size(); ++g) {
      lock.unlock();
      try {
        run_group(groups_[g]);
      } catch (...) {
        // A failed copy (CudaError) must reach the trainer, not terminate the process from this thread.
        lock.lock();
        error_ = std::current_exception();
        pending_ = false;
        cv_.notify_all();
        break;
      }
      lock.lock();
      done_ = g + 1;
      if (done_ == groups_.size()) {
        pending_ = false;
        update_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      cv_.notify_all();
    }
  }
}

void OffloadAdamW::run_group(const OffloadGroup& group) {
  // Gradients and parameters down into the host staging buffer (the device's side copies off the host), the update
  // on the host moments, the parameters back up.
  size_t at = 0;
  for (const auto& r : group) {
    const size_t bytes = r.count * sizeof(float);
    if (device_ != nullptr) {
      device_->side_to_host(stage_g_.data() + at, grads_ + r.offset, bytes);
      device_->side_to_host(stage_p_.data() + at, params_ + r.offset, bytes);
    } else {
      std::memcpy(stage_g_.data() + at, grads_ + r.offset, bytes);
      std::memcpy(stage_p_.data() + at, params_ + r.offset, bytes);
    }
    at += r.count;
  }
  at = 0;
  for (const auto& r : group) {
    const float decay = r.decay ? 1.0f - lr_ * hyper_.weight_decay : 1.0f;
    // AdamW::update's loop, element for element (the equivalence test checks the bits).
    cpu::adamw_update(pool_, stage_p_.data() + at, stage_g_.data() + at, m_.data() + r.offset, v_.data() + r.offset,
                      r.count, step_, decay, scale_);
    at += r.count;
  }
  at = 0;
  for (const auto& r : group) {
    if (device_ != nullptr) {
      device_->side_to_device(params_ + r.offset, stage_p_.data() + at, r.count * sizeof(float));
    } else {
      std::memcpy(params_ + r.offset, stage_p_.data() + at, r.count * sizeof(float));
    }
    at += r.count;
  }
}

}  // namespace railyard::worker
