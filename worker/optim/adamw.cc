#include "worker/optim/adamw.h"

#include <cmath>
#include <cstring>

#include "worker/device/cpu_kernels.h"

namespace railyard::worker {

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return max_lr * static_cast<double>(step + 1) / warmup_steps;
  const double min_lr = max_lr * min_lr_frac;
  const int64_t span = std::max<int64_t>(1, static_cast<int64_t>(total_steps) - warmup_steps);
  double r = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  r = std::min(1.0, std::max(0.0, r));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (max_lr - min_lr);
}

bool decays(int i) {
  const auto name = kParamNames[i];
  return name == "wte" || name == "wpe" || name == "qkvw" || name == "attprojw" || name == "fcw" || name == "fcprojw";
}

float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0f;
  const double f = max_norm / (norm + 1e-6);
  return f < 1.0 ? static_cast<float>(f) : 1.0f;
}

AdamW::AdamW(const GptConfig& config, const AdamWHyper& hyper, ThreadPool& pool, Kernels<float>* device)
    : config_(config),
      hyper_(hyper),
      own_device_(device == nullptr ? std::make_unique<CpuKernels<float>>(pool) : nullptr),
      dev_(device == nullptr ? own_device_.get() : device),
      m_(*dev_, num_parameters(config)),
      v_(*dev_, num_parameters(config)) {}

double AdamW::global_norm(const float* g) { return dev_->global_norm(g, m_.size()); }

void AdamW::update(float* params, const float* grads, float lr, float grad_scale) {
  ++t_;
  auto sizes = param_sizes(config_);
  size_t offset = 0;
  // The 16 llm.c tensors, then the MoE router (L, E, C), a matrix: decayed.
  const int tensors = kNumParamTensors + (router_size(config_) > 0 ? 1 : 0);
  for (int ti = 0; ti < tensors; ++ti) {
    const bool router = ti == kNumParamTensors;
    const float wd = router || decays(ti) ? hyper_.weight_decay : 0.0f;
    const size_t count = router ? router_size(config_) : sizes[ti];
    dev_->adamw_update(params + offset, grads + offset, m_.data() + offset, v_.data() + offset, count, lr, hyper_.beta1,
                       hyper_.beta2, hyper_.eps, wd, t_, grad_scale);
    offset += count;
  }
}

}  // namespace railyard::worker
