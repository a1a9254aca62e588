// A model whose parameters are split across ranks (tensor and/or pipeline parallel), as the trainer drives it. The
// adapter over worker/parallel's ParallelModel implements it (worker/parallel/dist_model.h); the plain Gpt<float>
// path of the trainer does not use it. Every method is collective over the model-parallel ranks of one replica.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "worker/parallel/step_times.h"

namespace railyard::worker {

template <typename T>
class Kernels;

class ShardedModel {
 public:
  using NextBatch = std::function<void(int32_t* inputs, int32_t* targets)>;
  virtual ~ShardedModel() = default;

  // This rank's flat local buffers.
  virtual size_t num_params() const = 0;
  virtual float* params() = 0;
  virtual float* grads() = 0;
  // The full model initialised with `seed` (init_gpt2_weights), this rank keeping its slices.
  virtual void init_weights(uint64_t seed) = 0;

  // Forward and backward of M micro-batches, gradients overwritten (not accumulated across calls) and scaled by
  // dloss; tied copies synchronised. Returns the mean loss over the M micro-batches on every rank of the replica.
  virtual double forward_backward(int M, const NextBatch& next, float dloss, parallel::StepTimes* times) = 0;
  // Reports, during the last micro-batch's backward of each forward_backward (and the tied-copy sync after it),
  // every local range of grads() once as soon as it is final: the data-parallel reducer overlaps with backward.
  virtual void set_grad_ready_hook(std::function<void(size_t offset, size_t count)> hook) = 0;
  // Mean loss over M micro-batches, forward only.
  virtual double evaluate(int M, const NextBatch& next) = 0;
  // Mixture of experts: {assignments, dropped choices, load-balancing loss} of the last forward_backward, summed over
  // its micro-batches and the whole replica (every rank of it the same); false for a dense model.
  virtual bool moe_stats(double /*out*/[3]) { return false; }
  // sqrt of the sum over every model element, counted once, of grads^2: the same value on every rank of the replica.
  virtual double grad_norm(const float* grads) = 0;
  // True on every rank of the whole job if `local` is true on any (the trainer's skip decision).
  virtual bool any(bool local) = 0;
  // AdamW (worker/optim arithmetic) on the local buffers, per-tensor weight decay of the llm.c tensor each piece is.
  virtual void update(float* params, const float* grads, float lr, float grad_scale) = 0;
  virtual int64_t adam_t() const = 0;
  virtual void set_adam_t(int64_t t) = 0;
  // For the start-up log: stage layers, local shapes, parameters held.
  virtual std::string describe() const = 0;

  // The device the model lives on (null: the CPU). On a device that is not the host, params()/grads() are device
  // memory and host_params() (and the moments a checkpoint reads) are host copies: refresh_host() makes them current
  // (device -> host) if the device's values changed since the last refresh, and Trainer::state() calls it, so only
  // checkpoint, snapshot and export steps pay the copy. upload_host() writes the copies back to the device (after a
  // restore wrote into them).
  virtual const Kernels<float>* device() const { return nullptr; }
  virtual float* host_params() { return params(); }
  virtual void refresh_host() {}
  virtual void upload_host() {}
  // Off the host, after the parameters were changed by someone else (ZeRO's update): host_params() is stale until
  // the next refresh_host().
  virtual void params_changed() {}
};

}  // namespace railyard::worker
