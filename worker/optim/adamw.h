// AdamW over the flat parameter buffer, the learning-rate schedule, and the global gradient norm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "worker/device/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker {

// Linear warmup over `warmup_steps` to max_lr, then cosine decay to max_lr * min_lr_frac at total_steps:
//   step < warmup:  max_lr * (step + 1) / warmup
//   else:           min + 0.5 * (1 + cos(pi * r)) * (max_lr - min),  r = (step - warmup) / max(1, total - warmup)
// Steps are 0-based; r is clamped to 1.
struct LrSchedule {
  double max_lr = 6e-4;
  int warmup_steps = 0;
  int total_steps = 1;
  double min_lr_frac = 0.1;
  double at(int64_t step) const;
};

// Which tensors get weight decay: the 2-D matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw), as nanoGPT; biases and
// LayerNorm parameters never do.
bool decays(int tensor_index);

struct AdamWHyper {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

class AdamW {
 public:
  // device: where params, grads and the moments live and the update runs (kernels.h); null = the CPU on `pool`.
  AdamW(const GptConfig& config, const AdamWHyper& hyper, ThreadPool& pool, Kernels<float>* device = nullptr);

  // One update (torch.optim.AdamW's arithmetic, decoupled decay): with g = grad * grad_scale,
  //   p *= 1 - lr * wd (decayed tensors only);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
  //   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  // grad_scale carries the clipping factor, so clipping costs no extra pass over the gradients. One device call per
  // tensor (weight decay 0 for the tensors decays() excludes). params/grads are device pointers.
  void update(float* params, const float* grads, float lr, float grad_scale);

  // sqrt(sum g^2) in double over a fixed grid of chunks, summed in order: independent of the thread count.
  // Runs on the device; the result is copied to the host.
  double global_norm(const float* grads);

  // Device pointers (host memory on the CPU).
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }
  size_t size() const { return m_.size(); }
  // Updates applied so far (the t of the bias corrections); settable to restore a checkpoint.
  int64_t t() const { return t_; }
  void set_t(int64_t t) { t_ = t; }
  const AdamWHyper& hyper() const { return hyper_; }

 private:
  GptConfig config_;
  AdamWHyper hyper_;
  std::unique_ptr<Kernels<float>> own_device_;  // the CPU, when no device was given
  Kernels<float>* dev_;
  DeviceBuffer<float> m_, v_;
  int64_t t_ = 0;
};

// clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
float clip_factor(double norm, double max_norm);

}  // namespace railyard::worker
